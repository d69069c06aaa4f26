"""Trains a small MLP classifier on synthetic data (CPU) and checkpoints it with zcc.

    python3 train_mlp.py --socket /tmp/zcc-example/zccd.sock --root /tmp/zcc-example/ckpt \\
        --steps 200 --save-every 50 --ema-decay 0.99

Run it again with the same arguments and it resumes from the newest committed
checkpoint, bit for bit: parameters, AdamW moments, the OneCycleLR schedule,
the RNG streams that draw the data and the dropout masks, and a user dict.
Under torchrun (RANK/WORLD_SIZE/MASTER_ADDR in the environment) it trains with
DistributedDataParallel over gloo; see README.md.

Every step prints "step=N loss=<float.hex()>" so that runs can be compared
exactly; --dump DIR writes the final parameters and EMA as safetensors files
(into DIR/rankN/ with several ranks).
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

IN, HIDDEN, CLASSES = 32, 64, 8


class MLP(torch.nn.Module):
    def __init__(self, batchnorm=False):
        super().__init__()
        self.fc1 = torch.nn.Linear(IN, HIDDEN)
        # BatchNorm's running statistics are buffers the forward pass updates;
        # DDP ranks would each keep their own, so it is a single-process option.
        self.norm = torch.nn.BatchNorm1d(HIDDEN) if batchnorm else torch.nn.LayerNorm(HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, HIDDEN)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        x = F.gelu(self.norm(self.fc1(x)))
        x = self.drop(F.gelu(self.fc2(x)))
        return self.head(x)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", default="mlp", help="zcc job id")
    p.add_argument("--socket", default=os.environ.get("ZCC_SOCKET", ""),
                   help="zccd socket; a comma-separated list spreads the ranks over several "
                        "zccds in order, as if over nodes (testing)")
    p.add_argument("--root", default=os.environ.get("ZCC_ROOT", ""), help="checkpoint root")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--ema-decay", type=float, default=0.99)
    p.add_argument("--batchnorm", action="store_true", help="BatchNorm instead of LayerNorm")
    p.add_argument("--dataloader", action="store_true",
                   help="draw batches from a fixed dataset through torchdata's "
                        "StatefulDataLoader (checkpointed: a resume goes on at the next batch)")
    p.add_argument("--backpressure", default="skip", choices=["skip", "block"],
                   help="block: never skip a snapshot (the EMA then sees every step)")
    p.add_argument("--persist-on-failure", action="store_true",
                   help="zccd persists the newest snapshot if this process dies")
    p.add_argument("--no-zcc", action="store_true", help="train without checkpointing")
    p.add_argument("--pause-after", type=int, default=0,
                   help="after this step: flush, print 'paused', and wait to be killed")
    p.add_argument("--wait-commit", type=int, default=0,
                   help="with --pause-after: first wait until this step is committed")
    p.add_argument("--dump", default="", help="write final.safetensors and ema.safetensors here")
    p.add_argument("--connect-timeout", type=float, default=30.0,
                   help="how long restore() waits to be registered with zccd")
    p.add_argument("--last-snapshot", default="",
                   help="RANK:STEP (testing): that rank takes no snapshot after STEP, so the "
                        "ranks' newest snapshots differ when they are killed")
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        torch.distributed.init_process_group("gloo")

    torch.manual_seed(args.seed)  # the same initial model on every rank
    teacher = torch.randn(IN, CLASSES, generator=torch.Generator().manual_seed(1234))
    model = MLP(batchnorm=args.batchnorm)
    trained = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr,
                                                    total_steps=args.steps)
    torch.manual_seed(args.seed * 1000 + rank + 1)  # each rank draws its own data
    user_state = {"samples_seen": 0}
    loader, batches = None, None
    if args.dataloader:
        from torchdata.stateful_dataloader import StatefulDataLoader
        # 2048 samples, shuffled by the loader's own generator: 64 batches
        # of 32 an epoch. (torchdata 0.11 resumes within an epoch exactly; the
        # epochs after a resumed one are shuffled otherwise than without the
        # resume, whether the loader has a generator or draws from torch's.)
        samples = torch.randn(2048, IN, generator=torch.Generator().manual_seed(99))
        loader = StatefulDataLoader(samples, batch_size=args.batch, shuffle=True, drop_last=True,
                                    generator=torch.Generator().manual_seed(7 + rank))

    ckpt = None
    start = 1
    if not args.no_zcc:
        from zcc.torch import Checkpointer
        sockets = args.socket.split(",")
        socket = sockets[rank * len(sockets) // world]
        ckpt = Checkpointer(trained, optimizer, job_id=args.job, socket=socket,
                            root=args.root, save_every=args.save_every,
                            ema_decay=args.ema_decay, scheduler=scheduler,
                            user_state=user_state, backpressure=args.backpressure,
                            persist_on_failure=args.persist_on_failure,
                            connect_timeout=args.connect_timeout,
                            state={"dataloader": loader} if loader is not None else None)
        restored = ckpt.restore()
        print("restored=%s from=%s samples_seen=%d"
              % (restored, ckpt.restored_from, user_state["samples_seen"]), flush=True)
        if restored is not None:
            start = restored + 1

    trained.train()
    for step in range(start, args.steps + 1):
        if loader is None:
            x = torch.randn(args.batch, IN)
        else:
            x = next(batches, None) if batches is not None else None
            while x is None:  # the first batch, or a new epoch (a resumed one can be spent)
                batches = iter(loader)
                x = next(batches, None)
        y = (x @ teacher).argmax(dim=1)
        loss = F.cross_entropy(trained(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()      # Checkpointer fences here first
        scheduler.step()
        user_state["samples_seen"] += args.batch * world
        snapshot_until = None
        if args.last_snapshot and int(args.last_snapshot.split(":")[0]) == rank:
            snapshot_until = int(args.last_snapshot.split(":")[1])
        if ckpt is None or (snapshot_until is not None and step > snapshot_until):
            result = "off"
        else:
            result = ckpt.step(step)
        print("step=%d loss=%s snapshot=%s" % (step, loss.item().hex(), result), flush=True)
        if step == args.pause_after:
            ckpt.flush()
            deadline = time.monotonic() + 60
            while args.wait_commit and time.monotonic() < deadline:
                status = ckpt.status()["checkpoint"]
                if status and status["last_committed_step"] >= args.wait_commit:
                    break
                time.sleep(0.02)
            print("paused", flush=True)
            while True:
                signal.pause()  # the test kills this process here

    if ckpt is not None:
        ckpt.flush()
        print("status=%s" % ckpt.status(), flush=True)
    if args.dump:
        from safetensors.torch import save_file
        dump = os.path.join(args.dump, "rank%d" % rank) if world > 1 else args.dump
        os.makedirs(dump, exist_ok=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  os.path.join(dump, "final.safetensors"))
        if ckpt is not None and args.ema_decay > 0:
            # With replicas, the EMA of the parameters this rank's copy is written from.
            ema = ckpt.ema_state_dict(include_buffers=False)
            print("ema_step=%d ema_tensors=%d" % (ckpt.ema_step, len(ema)), flush=True)
            save_file(dict(ema), os.path.join(dump, "ema.safetensors"))
    if ckpt is not None:
        ckpt.close()
    if world > 1:
        torch.distributed.destroy_process_group()
    print("done samples_seen=%d" % user_state["samples_seen"], flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
