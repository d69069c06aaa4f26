"""A training loop checkpointed with zcc's three lines, run by wheel_test.sh with
the zcc installed from the wheel (never the source tree).

    python train_loop.py --socket S --root R --job J --steps N --save-every K

Prints, one per line: "zcc=<package folder> version=<v>", "restored=<step|None>",
"params_at_restore=<sha256 of the parameters>" (after restore(), before training),
"trained=<first>..<last>", "committed=<step>" (it waits until its newest due
checkpoint is committed) and "params=<sha256>" at the end.
"""

import argparse
import hashlib
import os
import sys
import time

import torch

import zcc
from zcc.torch import Checkpointer


def params_digest(model):
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--job", default="wheel")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-every", type=int, required=True)
    args = p.parse_args(argv)
    print("zcc=%s version=%s" % (os.path.dirname(zcc.__file__), zcc.__version__), flush=True)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    # The three lines (README.md, "Install into your own environment"); "block"
    # so that no snapshot is skipped and every due step is checkpointed.
    ckpt = Checkpointer(model, optimizer, job_id=args.job, save_every=args.save_every,
                        socket=args.socket, root=args.root, backpressure="block")
    start = (ckpt.restore() or 0) + 1
    print("restored=%s" % (start - 1 if start > 1 else None), flush=True)
    print("params_at_restore=%s" % params_digest(model), flush=True)
    for step in range(start, args.steps + 1):
        loss = model(torch.randn(8, 16)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ckpt.step(step)
    print("trained=%d..%d" % (start, args.steps), flush=True)

    due = args.steps // args.save_every * args.save_every
    ckpt.flush()
    deadline = time.monotonic() + 60
    committed = -1
    while committed < due:
        status = ckpt.status().get("checkpoint") or {}
        committed = status.get("last_committed_step", -1)
        if time.monotonic() > deadline:
            sys.exit("step %d was not committed within 60 s: %s" % (due, ckpt.status()))
        time.sleep(0.02)
    print("committed=%d" % committed, flush=True)
    print("params=%s" % params_digest(model), flush=True)
    ckpt.close()


if __name__ == "__main__":
    main(sys.argv[1:])
