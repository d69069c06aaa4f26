"""README.md's and python/README.md's code blocks run: each ```python block is executed
against a real zccd, with what the README leaves to the reader (a model, an
optimizer, arrays to register, "..." placeholders for the daemon's socket and
root) bound first. A README that names a function, keyword or return value
the package does not have fails here. Blocks that begin "import paddle" run
under Paddle's environment (readme_test.py --paddle, //python/tests:
readme_paddle_test); the others under PyTorch's."""

import os
import re
import sys
import traceback

import numpy as np

import zcc
from zccd_process import Zccd

PADDLE = sys.argv[1:] == ["--paddle"]
if not PADDLE:
    import torch

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", "."), "zcc")
READMES = ("README.md", "python/README.md")


def blocks(text):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def binding_block(code, d):
    """The binding's tour: arrays to register, and zccd's socket."""
    code = code.replace('zcc.connect("job", ',
                        'zcc.connect("job", socket_path=%r, checkpoint_root=%r, ' % (d.socket, d.root))
    scope = {"w": np.ones(1024, np.float32), "m": np.zeros(1024, np.float32),
             "blob": np.zeros(256, np.uint8), "world": 1, "rank": 0,
             "t": np.zeros(8, np.float32)}
    return code, scope


def checkpointer_block(code, d):
    """zcc.torch's loop: a model, an optimizer, a scheduler and a data
    loader, two steps."""
    code = code.replace("socket=..., root=..., rank=..., world_size=...",
                        "socket=%r, root=%r, rank=0, world_size=1" % (d.socket, d.root))
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    from torchdata.stateful_dataloader import StatefulDataLoader
    loader = StatefulDataLoader(torch.randn(16, 8), batch_size=4)
    return code, {"model": model, "optimizer": optimizer, "scheduler": scheduler, "steps": 2,
                  "loader": loader}


def three_lines_block(code, d):
    """The top-level README's three lines: zccd's socket and root from
    $ZCC_SOCKET and $ZCC_ROOT, a model whose output has a .loss, batch()."""
    os.environ["ZCC_SOCKET"] = d.socket
    os.environ["ZCC_ROOT"] = d.root

    class Output:
        def __init__(self, loss):
            self.loss = loss

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return Output(self.lin(x).square().mean())

    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return code, {"model": model, "optimizer": optimizer, "steps": 2,
                  "batch": lambda: torch.randn(4, 8)}


def paddle_block(code, d):
    """zcc.paddle's loop: zccd's socket and root from $ZCC_SOCKET and
    $ZCC_ROOT, two steps."""
    os.environ["ZCC_SOCKET"] = d.socket
    os.environ["ZCC_ROOT"] = d.root
    assert "range(start, 1001)" in code, code
    return code.replace("range(start, 1001)", "range(start, 3)"), {}


def main():
    found = []
    for readme in READMES:
        with open(os.path.join(RUNFILES, readme)) as f:
            found += [(readme, code) for code in blocks(f.read())]
    prepare = {("python/README.md", "import numpy as np, zcc"): binding_block,
               ("python/README.md", "from zcc.torch import Checkpointer"): checkpointer_block,
               ("README.md", "from zcc.torch import Checkpointer"): three_lines_block}
    if PADDLE:
        prepare = {("python/README.md", "import paddle"): paddle_block}
    ran = 0
    failed = []
    for i, (readme, code) in enumerate(found):
        first = code.strip().splitlines()[0]
        if (first == "import paddle") != PADDLE:
            print("%s block %d (%s): run by the %s environment's readme test"
                  % (readme, i, first, "PyTorch" if PADDLE else "Paddle"))
            continue
        if (readme, first) not in prepare:
            failed.append("%s block %r: no preparation for it in readme_test.py" % (readme, first))
            continue
        with Zccd("readme%d" % i) as d:
            prepared, scope = prepare[(readme, first)](code, d)
            try:
                exec(compile(prepared, "%s block %d" % (readme, i), "exec"), scope)
                ran += 1
                print("ok %s block %d (%s)" % (readme, i, first))
            except Exception:
                failed.append("%s block %d (%s):\n%s" % (readme, i, first, traceback.format_exc()))
            finally:
                for name in ("client", "ckpt"):
                    obj = scope.get(name)
                    if obj is not None and hasattr(obj, "close"):
                        try:
                            obj.close()
                        except Exception:
                            pass
            assert d.stop() == 0, d.log()
    for f in failed:
        print("FAILED", f)
    print("%d passed, %d failed" % (ran, len(failed)))
    if failed or ran == 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
