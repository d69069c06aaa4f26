"""One rank of dtensor_test.py, under torchrun (gloo, CPU).

    worker.py save    --layout L --socket S --root R --job J --steps N --ref DIR
    worker.py restore --layout L --socket S --root R --job J --ref DIR [--expect-from F]
    worker.py resume  --layout L ... --ref DIR --new-ref DIR2 --steps M
    worker.py changed --layout L --socket S --root R --job J --change {resized,extra,extra_last}
    worker.py refused

Layouts: "single" (a plain model; every rank would hold all of it), "fsdp"
(fully_shard over all ranks), "tp" (tensor parallel over all ranks) and
"fsdp_tp" (a 2 x (world/2) mesh: fully_shard over "dp", tensor parallel over
"tp"). `save` trains N steps with AdamW and a Checkpointer (save_every=N, EMA)
and writes the full model and optimizer state it reached to DIR/state.pt
(rank 0), and each rank's generators and user_state to DIR/rank<r>.pt;
`restore` builds the model in its layout, restores the newest checkpoint and
checks that its full state equals DIR/state.pt element for element and each
rank's own state its rank's (or, on a rank the saving job did not have,
rank 0's user_state and its generators untouched); `resume` restores, checks,
trains on to M and saves like `save`, into DIR2. `changed` restores into a model with one parameter resized or one
added and checks the error and that nothing was overwritten.
"""

import argparse
import os
import random
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict)

import zcc
from zcc.torch import Checkpointer
from zcc.torch_layout import is_dtensor

DIM, HIDDEN, OUT = 16, 36, 5  # 36 rows over 4 ranks: 9 each; 5 over 4: 2, 2, 1 and none


class Net(torch.nn.Module):
    def __init__(self, out=OUT, extra=False):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.up = torch.nn.Linear(DIM, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, DIM)
        self.head = torch.nn.Linear(DIM, out)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, DIM))  # persistent, plain
        if extra:
            self.gate = torch.nn.Parameter(torch.ones(DIM))

    def forward(self, x):
        h = self.norm(x) * self.scale
        h = self.down(F.gelu(self.up(h))) + x
        return self.head(h)


def build(layout, world, out=OUT, extra=False):
    torch.manual_seed(0)
    model = Net(out, extra)
    if layout == "single":
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    if layout == "fsdp":
        mesh = init_device_mesh("cpu", (world,))
        for m in (model.up, model.down, model.head):
            fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif layout == "tp":
        mesh = init_device_mesh("cpu", (world,))
        parallelize_module(model, mesh, plan)
        # The layer norm, the head and the buffer stay plain, replicated tensors.
    elif layout == "fsdp_tp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], plan)
        for m in (model.up, model.down, model.head):
            fully_shard(m, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    else:
        raise ValueError(layout)
    return model


def full_state(model, opt):
    """The global model and optimizer state on every rank, as CPU tensors."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=False)
    m = get_model_state_dict(model, options=opts)
    o = get_optimizer_state_dict(model, opt, options=opts)
    flat = {"model." + k: v for k, v in m.items()}
    for fqn, state in o["state"].items():
        for key, v in state.items():
            flat["optim.%s.%s" % (fqn, key)] = v
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in flat.items()}


def say(message):
    """One line in one write: the ranks share torchrun's stdout."""
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, DIM, generator=g), torch.randint(0, OUT, (8,), generator=g)


def data_rank(layout, rank, world):
    """Tensor-parallel ranks of one data-parallel replica see the same batch."""
    return {"tp": 0, "fsdp_tp": rank // max(1, world // 2)}.get(layout, rank)


def optimizers(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)


def train(args, model, opt, sched, ckpt, user_state, first, rank, world):
    """Steps first..args.steps, each drawing from this rank's generators and
    snapshotting; then this rank's state as the last
    snapshot holds it, in DIR/rank<r>.pt."""
    for step in range(first, args.steps + 1):
        x, y = batch(step, data_rank(args.layout, rank, world))
        torch.rand(3), random.random()  # (the batch has its own generator)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        user_state["epoch"] = step
        user_state["seen_by"] = rank
        ckpt.step(step)
    torch.save({"torch_rng": torch.get_rng_state(), "python_random": random.getstate(),
                "user_state": dict(user_state), "world": world},
               os.path.join(args.ref, "rank%d.pt" % rank))


def finish_save(args, model, opt, sched, ckpt, rank, world):
    ckpt.flush()
    if args.layout == "fsdp":
        # Every parameter a shard of this rank's: its EMA is a DTensor of the
        # same placements, which a model of the same layout loads.
        ema = ckpt.ema_state_dict()
        params = dict(model.named_parameters())
        assert all(is_dtensor(ema[n]) and ema[n].placements == p.placements
                   for n, p in params.items()), {n: type(v) for n, v in ema.items()}
        build(args.layout, world).load_state_dict(ema)
    state = full_state(model, opt)
    state["scheduler.last_epoch"] = torch.tensor(sched.last_epoch)
    if rank == 0:
        torch.save(state, os.path.join(args.ref, "state.pt"))
        say("saved %d tensors" % len(state))
    # The job is restarted next, and its first restore comes from memory.
    ckpt.close(keep_snapshots=True)


def save(args, rank, world):
    model = build(args.layout, world)
    opt, sched = optimizers(model)
    user_state = {"epoch": 0}
    ckpt = Checkpointer(model, opt, job_id=args.job, socket=args.socket, root=args.root,
                        save_every=args.save_every or args.steps, ema_decay=0.9,
                        backpressure="block", scheduler=sched, user_state=user_state)
    assert ckpt.wait_connected(60), "not connected to zccd"
    torch.manual_seed(100 + rank)
    random.seed(100 + rank)
    train(args, model, opt, sched, ckpt, user_state, 1, rank, world)
    finish_save(args, model, opt, sched, ckpt, rank, world)


def restored(args, rank, world, save_every=0):
    """A model in args.layout restored from the newest checkpoint, checked
    against DIR: the global model, optimizer and scheduler state element for
    element; this rank's generators and user_state as the rank of the same
    number left them, or, on a rank the writing job did not have, the
    generators as seeded here and rank 0's user_state."""
    model = build(args.layout, world)
    opt, sched = optimizers(model)
    user_state = {"epoch": -1}
    ckpt = Checkpointer(model, opt, job_id=args.job, socket=args.socket, root=args.root,
                        ema_decay=0.9, scheduler=sched, user_state=user_state,
                        save_every=save_every, backpressure="block")
    torch.manual_seed(500 + rank)
    random.seed(500 + rank)
    seeded = (torch.get_rng_state(), random.getstate())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = ckpt.restore()
    assert got == args.expect_step, "restored %s, expected %d" % (got, args.expect_step)
    if args.expect_from:
        assert ckpt.restored_from == args.expect_from, (ckpt.restored_from, args.expect_from)
    state = full_state(model, opt)
    state["scheduler.last_epoch"] = torch.tensor(sched.last_epoch)
    want = torch.load(os.path.join(args.ref, "state.pt"))
    assert sorted(state) == sorted(want), (sorted(set(state) ^ set(want)))
    bad = [k for k in want if want[k].shape != state[k].shape or want[k].dtype != state[k].dtype
           or not torch.equal(want[k], state[k])]
    assert not bad, "rank %d: %s differ after restoring (%s)" % (rank, bad, ckpt.restored_from)
    assert opt.param_groups[0]["lr"] == sched.get_last_lr()[0], (opt.param_groups, sched.get_last_lr())
    saved_world = torch.load(os.path.join(args.ref, "rank0.pt"))["world"]
    messages = [str(w.message) for w in caught if "written by" in str(w.message)]
    if rank < saved_world:
        mine = torch.load(os.path.join(args.ref, "rank%d.pt" % rank))
        assert ckpt.restored_rank_state is True
        assert torch.equal(torch.get_rng_state(), mine["torch_rng"]), "rank %d: torch RNG" % rank
        assert random.getstate() == mine["python_random"], "rank %d: Python RNG" % rank
        assert user_state == mine["user_state"], (rank, user_state, mine["user_state"])
        if rank == 0 and saved_world > world:  # the ranks lost are named
            assert any("ranks %d-%d are not restored" % (world, saved_world - 1) in m
                       for m in messages), messages
        else:
            assert not messages, messages
    else:
        first = torch.load(os.path.join(args.ref, "rank0.pt"))
        assert ckpt.restored_rank_state is False
        assert torch.equal(torch.get_rng_state(), seeded[0]), "rank %d: torch RNG changed" % rank
        assert random.getstate() == seeded[1], "rank %d: Python RNG changed" % rank
        assert user_state == first["user_state"], (rank, user_state, first["user_state"])
        assert any("rank %d had no state of its own" % rank in m for m in messages), messages
    return model, opt, sched, ckpt, user_state, got, len(want)


def restore(args, rank, world):
    model, opt, sched, ckpt, _, got, tensors = restored(args, rank, world)
    # Training goes on from the restored state.
    x, y = batch(args.expect_step + 1, data_rank(args.layout, rank, world))
    F.cross_entropy(model(x), y).backward()
    opt.step()
    ckpt.step(args.expect_step + 1)
    ckpt.close()
    say("restored step %d from %s: %d tensors equal" % (got, ckpt.restored_from, tensors))


def resume(args, rank, world):
    """restore's checks, then training on to --steps, checkpointed there,
    with the state reached written to --new-ref for the next resume."""
    model, opt, sched, ckpt, user_state, got, tensors = restored(args, rank, world,
                                                                 save_every=args.steps)
    args.ref = args.new_ref
    train(args, model, opt, sched, ckpt, user_state, got + 1, rank, world)
    finish_save(args, model, opt, sched, ckpt, rank, world)
    say("restored step %d from %s: %d tensors equal; trained on to step %d"
        % (got, ckpt.restored_from, tensors, args.steps))


def changed(args, rank, world):
    # extra_last: only the last rank's model differs; every rank must still
    # raise the layout error (not a connection error about another rank).
    extra = args.change == "extra" or (args.change == "extra_last" and rank == world - 1)
    model = build(args.layout, world, out=OUT + 1 if args.change == "resized" else OUT,
                  extra=extra)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = full_state(model, opt)
    ckpt = Checkpointer(model, opt, job_id=args.job, socket=args.socket, root=args.root)
    try:
        ckpt.restore()
    except zcc.Error as e:
        say("refused: %s: %s" % (type(e).__name__, e))
    else:
        raise AssertionError("restoring into a changed model succeeded")
    after = full_state(model, opt)
    assert sorted(before) == sorted(after)
    bad = [k for k in before if not torch.equal(before[k], after[k])]
    assert not bad, "a refused restore changed %s" % bad
    ckpt.close()


def refused(args, rank, world):
    """Models the Checkpointer must refuse, each with a message naming the tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor, Partial, Shard
    partial = torch.nn.Linear(4, 4)
    mesh = init_device_mesh("cpu", (world,))
    partial.weight = torch.nn.Parameter(DTensor.from_local(torch.ones(4, 4), mesh, [Partial()]))
    strided = torch.nn.Linear(4, 4)
    strided.weight = torch.nn.Parameter(
        DTensor.from_local(torch.ones(4, 4).t(), mesh, [Shard(0)], run_check=False))
    # FSDP1 cannot be constructed without an accelerator: an instance of its
    # class around a plain layer stands for one (the check is by class).
    fsdp1 = FullyShardedDataParallel.__new__(FullyShardedDataParallel)
    torch.nn.Module.__init__(fsdp1)
    fsdp1.inner = torch.nn.Linear(4, 4)
    cases = {"partial": (partial, "Partial placement"),
             "fsdp1": (torch.nn.Sequential(fsdp1), "fully_shard (FSDP2)"),
             "meta": (torch.nn.Linear(4, 4, device="meta"), "device meta"),
             "non-contiguous": (strided, "not contiguous")}
    for what, (model, expect) in cases.items():
        try:
            Checkpointer(model, None, job_id=args.job, socket=args.socket, root=args.root)
        except ValueError as e:
            assert expect in str(e), (what, str(e))
            say("refused %s: %s" % (what, e))
        else:
            raise AssertionError("the Checkpointer accepted a %s model" % what)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["save", "restore", "resume", "changed", "refused"])
    p.add_argument("--layout", default="single")
    p.add_argument("--socket", default="")
    p.add_argument("--root", default="")
    p.add_argument("--job", default="dtensor")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--save-every", type=int, default=0, help="save: default --steps")
    p.add_argument("--expect-step", type=int, default=4)
    p.add_argument("--expect-from", default="", help="memory or disk (default: either)")
    p.add_argument("--ref", default="")
    p.add_argument("--new-ref", default="")
    p.add_argument("--change", default="resized")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        globals()[args.mode](args, rank, world)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
