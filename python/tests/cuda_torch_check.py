"""zcc.torch with CUDA tensors, on a real GPU (tools/gpu/run_gpu_checks.sh runs
it where PyTorch with CUDA and zcc are importable; CI has no GPU).

    python cuda_torch_check.py --zccd /path/to/zccd

A model and AdamW on cuda:0, twice: the Checkpointer must pick the CUDA
copier by itself; then with copier=zcc.daemon_pull(0) against a zccd started
with --daemon_pull, zccd copying the tensors over CUDA IPC. Each time it
snapshots every step (the trainer-side cost of ckpt.step() is printed, in
microseconds), commits, and restores into a freshly initialised model on the
GPU with every parameter and optimizer state equal. Exits 0 with "no CUDA
device" where torch sees none.
"""

import argparse
import os
import statistics
import sys
import time

import torch

from zccd_process import Zccd


def build(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def check(args, variant):
    import zcc
    from zcc.torch import Checkpointer
    pull = variant == "daemon_pull"
    extra = {"copier": zcc.daemon_pull(0)} if pull else {}
    with Zccd("gpu", binary=args.zccd, extra_flags=["--daemon_pull"] if pull else []) as d:
        model, opt = build(0)
        ckpt = Checkpointer(model, opt, job_id="gpu", socket=d.socket, root=d.root,
                            save_every=args.steps, ema_decay=0.99, backpressure="block", **extra)
        assert ckpt.client.copier == ("cuda_ipc" if pull else "cuda"), ckpt.client.copier
        costs = []
        for step in range(1, args.steps + 1):
            x = torch.randn(64, 1024, device="cuda")
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            start = time.perf_counter()
            ckpt.step(step)
            costs.append((time.perf_counter() - start) * 1e6)
        ckpt.flush()
        torch.cuda.synchronize()
        d.wait_latest("gpu", args.steps)
        want = {k: v.clone() for k, v in model.state_dict().items()}
        want_opt = {i: {k: v.clone() for k, v in s.items() if torch.is_tensor(v)}
                    for i, s in enumerate(opt.state.values())}
        ckpt.close()
        model2, opt2 = build(1)
        ckpt2 = Checkpointer(model2, opt2, job_id="gpu", socket=d.socket, root=d.root,
                             ema_decay=0.99, **extra)
        assert ckpt2.restore() == args.steps
        torch.cuda.synchronize()
        for k, v in model2.state_dict().items():
            assert torch.equal(v, want[k]), k
        for i, s in enumerate(opt2.state.values()):
            for k, v in s.items():
                if torch.is_tensor(v):
                    assert torch.equal(v, want_opt[i][k]), (i, k)
        ckpt2.close()
        assert d.stop() == 0, d.log()
    nbytes = sum(v.numel() * v.element_size() for v in want.values()) * 3
    print("cuda_torch_check: %s, copier %s: %d snapshots of %.1f MB; ckpt.step() median %.0f us, "
          "max %.0f us; restored from %s, every tensor equal"
          % (torch.cuda.get_device_name(), ckpt.client.copier, args.steps, nbytes / 1e6,
             statistics.median(costs), max(costs), ckpt2.restored_from))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--zccd", default=os.environ.get("ZCCD", "zccd"))
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("cuda_torch_check: no CUDA device; nothing to check")
        return 0
    for variant in ("cuda", "daemon_pull"):
        check(args, variant)
    return 0


if __name__ == "__main__":
    sys.exit(main())
