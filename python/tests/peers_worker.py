"""One rank of peers_test.py, under torchrun (gloo, CPU). Rank r uses the
zccd whose socket is the (r // per_node)-th of --sockets, each zccd with its
own node-local root.

    peers_worker.py membership --sockets S0,S1,... --roots R0,R1,... --job J
        registers a small model and AdamW and prints what its Checkpointer
        learnt of the peer tier (its zccd's peer address, its buddies);
    peers_worker.py save --per-node 2 ... --steps N --ref-step K --ref DIR
        trains dtensor_worker's model under FSDP2 over every rank, a snapshot
        each step and no disk checkpoint, and writes the global model and
        optimizer state of step K to DIR/state.pt (rank 0);
    peers_worker.py ddp ... --steps N
        trains a plain model replicated on every rank (data parallel) and
        prints the bytes of its model and optimizer state;
    peers_worker.py restore --per-node 2 ... --expect-step K --ref DIR
        builds the same model under FSDP2 over this job's ranks, restores, and
        checks that it restored step K equal to DIR/state.pt element for
        element.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import dtensor_worker as dw
from zcc.torch import Checkpointer


def checkpointer(args, model, opt, rank, world, **kwargs):
    sockets, roots = args.sockets.split(","), args.roots.split(",")
    node = (rank // args.per_node) % len(sockets)
    return Checkpointer(model, opt, job_id=args.job, socket=sockets[node], root=roots[node],
                        rank=rank, world_size=world, **kwargs)


def membership(args, rank, world):
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters())
    ckpt = checkpointer(args, model, opt, rank, world)
    print("rank=%d peer_address=%s buddies=%s" % (rank, ckpt.client.peer_address,
                                                  ",".join(ckpt.peer_buddies)), flush=True)
    ckpt.close()


def full_state_with_ema(model, opt, sched, ckpt):
    """The global model, optimizer, scheduler and EMA state (collective)."""
    state = dw.full_state(model, opt)
    state["scheduler.last_epoch"] = torch.tensor(sched.last_epoch)
    ema = ckpt.ema_state_dict(include_buffers=False)
    assert set(ema) == {n for n, _ in model.named_parameters()}, sorted(ema)
    for name in sorted(ema):  # the same order on every rank
        state["ema." + name] = ema[name].full_tensor().clone()
    return state


def save(args, rank, world):
    model = dw.build("fsdp", world)
    opt, sched = dw.optimizers(model)
    ckpt = checkpointer(args, model, opt, rank, world, save_every=0, ema_decay=0.9,
                        scheduler=sched, backpressure="block")
    assert ckpt.wait_connected(60), "not connected to zccd"
    for step in range(1, args.steps + 1):
        x, y = dw.batch(step, rank)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        ckpt.step(step)
        if step == args.ref_step:
            state = full_state_with_ema(model, opt, sched, ckpt)
            if rank == 0:
                torch.save(state, os.path.join(args.ref, "state.pt"))
    ckpt.flush()
    dw.say("rank=%d trained=%d" % (rank, args.steps))
    ckpt.close()


def ddp(args, rank, world):
    """A data-parallel job (every rank the same plain model): replicated
    steps carry each parameter and its optimizer state once for the job."""
    torch.manual_seed(0)  # 6.3 MB of state: large beside each rank's own small blobs
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 256))
    opt, sched = dw.optimizers(model)
    ckpt = checkpointer(args, model, opt, rank, world, save_every=0, scheduler=sched,
                        backpressure="block")
    for step in range(1, args.steps + 1):
        g = torch.Generator().manual_seed(step)  # the same batch: the replicas stay identical
        x, y = torch.randn(8, 256, generator=g), torch.randn(8, 256, generator=g)
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        ckpt.step(step)
    ckpt.flush()
    state = sum(t.numel() * t.element_size() for t in dw.full_state(model, opt).values())
    dw.say("rank=%d trained=%d state_bytes=%d" % (rank, args.steps, state))
    ckpt.close()


def restore(args, rank, world):
    model = dw.build("fsdp", world)
    opt, sched = dw.optimizers(model)
    ckpt = checkpointer(args, model, opt, rank, world, ema_decay=0.9, scheduler=sched,
                        backpressure="block")
    got = ckpt.restore()
    assert got == args.expect_step, "rank %d restored %s, expected %d" % (rank, got,
                                                                         args.expect_step)
    state = full_state_with_ema(model, opt, sched, ckpt)
    want = torch.load(os.path.join(args.ref, "state.pt"))
    assert sorted(state) == sorted(want), sorted(set(state) ^ set(want))
    bad = [k for k in want if not torch.equal(want[k], state[k])]
    assert not bad, "rank %d: %s differ" % (rank, bad)
    dw.say("rank=%d restored=%d from=%s equal=%d" % (rank, got, ckpt.restored_from, len(want)))
    ckpt.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["membership", "save", "ddp", "restore"])
    p.add_argument("--sockets", required=True)
    p.add_argument("--roots", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--per-node", type=int, default=1, help="consecutive ranks per zccd")
    p.add_argument("--steps", type=int, default=23)
    p.add_argument("--ref-step", type=int, default=20)
    p.add_argument("--expect-step", type=int, default=20)
    p.add_argument("--ref", default="")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        globals()[args.mode](args, rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
