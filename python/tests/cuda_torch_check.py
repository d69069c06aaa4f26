"""zcc.torch with CUDA tensors, on a real GPU (tools/gpu/run_gpu_checks.sh runs
it where PyTorch with CUDA and zcc are importable; CI has no GPU).

    python cuda_torch_check.py --zccd /path/to/zccd

A model and AdamW on cuda:0, twice: the Checkpointer must pick the CUDA
copier by itself; then with copier=zcc.daemon_pull(0) against a zccd started
with --daemon_pull, zccd copying the tensors over CUDA IPC. Each time it
snapshots every step (the trainer-side cost of ckpt.step() is printed, in
microseconds), commits, and restores from zccd's memory into a freshly
initialised model on the GPU with every parameter and optimizer state equal,
and the CUDA generator's state the one of the last step. Then a cold restore:
a larger model (--cold_mib of parameters, AdamW's state besides) persisted,
zccd restarted and the page cache dropped (where the node allows it) before
each restore, so that the step comes from disk; the restore into fresh
optimizer buffers with the host-to-device copies overlapping zccd's read
(early copy) and without, both exact, timed against torch.load of the same
state onto the GPU from a cold file. Exits 0 with "no CUDA device" where
torch sees none.
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
        # The CUDA generator as the last snapshot saw it (torch.randn above
        # moved its Philox offset at every step): the restore must bring it back.
        want_rng = [s.clone() for s in torch.cuda.get_rng_state_all()]
        ckpt.flush()
        torch.cuda.synchronize()
        d.wait_latest("gpu", args.steps)
        want = {k: v.clone() for k, v in model.state_dict().items()}
        want_opt = {i: {k: v.clone() for k, v in s.items() if torch.is_tensor(v)}
                    for i, s in enumerate(opt.state.values())}
        # Kept in zccd's memory, as for a launcher's restart: restored from there.
        ckpt.close(keep_snapshots=True)
        model2, opt2 = build(1)
        ckpt2 = Checkpointer(model2, opt2, job_id="gpu", socket=d.socket, root=d.root,
                             ema_decay=0.99, **extra)
        assert ckpt2.restore() == args.steps
        torch.cuda.synchronize()
        assert ckpt2.restored_from == "memory", ckpt2.restored_from
        got_rng = torch.cuda.get_rng_state_all()
        assert all(torch.equal(g, w) for g, w in zip(got_rng, want_rng)), (got_rng, want_rng)
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


def drop_caches():
    """True when the page cache could be dropped (root on most nodes)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def build_cold(seed, mib):
    torch.manual_seed(seed)
    layers = max(1, mib * 2**20 // (4096 * 4096 * 4))
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(layers)]).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def state_of(model, opt):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {i: {k: v.clone() for k, v in s.items() if torch.is_tensor(v)}
             for i, s in enumerate(opt.state.values())})


def assert_equal(model, opt, want):
    want_model, want_opt = want
    for k, v in model.state_dict().items():
        assert torch.equal(v, want_model[k]), k
    assert len(opt.state) == len(want_opt), (len(opt.state), len(want_opt))
    for i, s in enumerate(opt.state.values()):
        for k, v in s.items():
            if torch.is_tensor(v):
                assert torch.equal(v, want_opt[i][k]), (i, k)


def check_cold(args):
    """Construction + restore from disk after a zccd restart, with and
    without early copy, against torch.load of the same state (cold file)."""
    from zcc.torch import Checkpointer
    with Zccd("gpucold", binary=args.zccd) as d:
        model, opt = build_cold(0, args.cold_mib)
        ckpt = Checkpointer(model, opt, job_id="cold", socket=d.socket, root=d.root,
                            save_every=2, backpressure="block")
        for step in (1, 2):
            model(torch.randn(64, 4096, device="cuda")).square().mean().backward()
            opt.step()
            opt.zero_grad()
            ckpt.step(step)
        ckpt.flush()
        torch.cuda.synchronize()
        d.wait_latest("cold", 2)
        want = state_of(model, opt)
        nbytes = sum(v.numel() * v.element_size() for v in want[0].values()) + sum(
            v.numel() * v.element_size() for s in want[1].values() for v in s.values())
        ckpt.close()
        ref_path = os.path.join(d.dir, "torch_save.pt")
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, ref_path)
        del model, opt, ckpt
        torch.cuda.empty_cache()
        dropped = True
        times = {"early copy": [], "copy after the read": [], "torch.load": []}
        for _ in range(args.cold_rounds):
            for variant in ("copy after the read", "early copy"):
                d.stop()
                dropped = drop_caches() and dropped
                d.start()
                model2, opt2 = build_cold(1, args.cold_mib)
                torch.cuda.synchronize()
                start = time.perf_counter()
                ckpt2 = Checkpointer(model2, opt2, job_id="cold", socket=d.socket, root=d.root)
                if variant != "early copy":
                    ckpt2._early_copy = []
                assert ckpt2.restore() == 2
                torch.cuda.synchronize()
                times[variant].append(time.perf_counter() - start)
                assert ckpt2.restored_from == "disk", ckpt2.restored_from
                assert_equal(model2, opt2, want)
                ckpt2.close()
                del model2, opt2, ckpt2
                torch.cuda.empty_cache()
            model3, opt3 = build_cold(1, args.cold_mib)
            dropped = drop_caches() and dropped
            torch.cuda.synchronize()
            start = time.perf_counter()
            loaded = torch.load(ref_path, map_location="cuda")
            model3.load_state_dict(loaded["model"])
            opt3.load_state_dict(loaded["optim"])
            torch.cuda.synchronize()
            times["torch.load"].append(time.perf_counter() - start)
            del model3, opt3, loaded
            torch.cuda.empty_cache()
        assert d.stop() == 0, d.log()
    best = {k: min(v) for k, v in times.items()}
    print("cuda_torch_check: cold restore of %.2f GB (model + AdamW) onto %s, zccd restarted, "
          "page cache %s: construction + restore, best of %d: copy after the read %.3f s, "
          "early copy %.3f s, torch.load %.3f s (early copy %.2fx torch.load)"
          % (nbytes / 1e9, torch.cuda.get_device_name(),
             "dropped" if dropped else "NOT dropped (not allowed here)", args.cold_rounds,
             best["copy after the read"], best["early copy"], best["torch.load"],
             best["torch.load"] / best["early copy"]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--zccd", default=os.environ.get("ZCCD", "zccd"))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cold_mib", type=int, default=256,
                   help="parameters of the cold-restore model (AdamW adds twice that)")
    p.add_argument("--cold_rounds", type=int, default=2)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("cuda_torch_check: no CUDA device; nothing to check")
        return 0
    for variant in ("cuda", "daemon_pull"):
        check(args, variant)
    check_cold(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
