"""A Paddle training loop checkpointed with zcc.paddle.

    python examples/train_paddle.py --socket /tmp/zcc-example/zccd.sock \\
        --root /tmp/zcc-example/ckpt --steps 200 --save-every 50

An MLP with LayerNorm and dropout regresses a fixed random target, trained by
AdamW under a warm-up + cosine schedule; zccd keeps an EMA of the weights.
Run it again and it resumes from the newest checkpoint (zccd's memory when
the previous run died with zccd up, else the disk), bit-exact: the losses of
a resumed run equal those of an uninterrupted one. Each step prints
"step=N loss=<float.hex()>".

The zcc part is three lines: build the Checkpointer, restore(), step().
"""

import argparse
import os
import signal
import time

import numpy as np
import paddle


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", default="paddle-mlp", help="zcc job id")
    p.add_argument("--socket", default=os.environ.get("ZCC_SOCKET", ""),
                   help="zccd's socket (default $ZCC_SOCKET, else zccd's default)")
    p.add_argument("--root", default=os.environ.get("ZCC_ROOT", ""), help="checkpoint root")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--ema-decay", type=float, default=0.99)
    p.add_argument("--no-zcc", action="store_true", help="train without checkpointing")
    p.add_argument("--pause-after", type=int, default=0,
                   help="after this step: flush, print 'paused', and wait to be killed")
    return p.parse_args()


class Batches:
    """Batches drawn from a fixed dataset by a generator of its own, whose
    position is checkpointed (a `state` object)."""

    def __init__(self, seed, batch):
        data = np.random.default_rng(seed)
        self.x = data.standard_normal((1024, 32)).astype("float32")
        self.y = np.tanh(self.x @ data.standard_normal((32, 4))).astype("float32")
        self.rng = np.random.default_rng(seed + 1)
        self.batch = batch

    def next(self):
        i = self.rng.integers(0, len(self.x), self.batch)
        return paddle.to_tensor(self.x[i]), paddle.to_tensor(self.y[i])

    def state_dict(self):
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state):
        self.rng.bit_generator.state = state["rng"]


def main():
    args = parse_args()
    paddle.seed(args.seed)
    model = paddle.nn.Sequential(paddle.nn.Linear(32, 128), paddle.nn.LayerNorm(128),
                                 paddle.nn.GELU(), paddle.nn.Dropout(0.1), paddle.nn.Linear(128, 4))
    cosine = paddle.optimizer.lr.CosineAnnealingDecay(learning_rate=args.lr, T_max=args.steps)
    sched = paddle.optimizer.lr.LinearWarmup(cosine, warmup_steps=10, start_lr=0.0,
                                             end_lr=args.lr)
    optimizer = paddle.optimizer.AdamW(learning_rate=sched, parameters=model.parameters(),
                                       weight_decay=0.01)
    batches = Batches(args.seed, args.batch)

    ckpt = None
    start = 1
    if not args.no_zcc:
        from zcc.paddle import Checkpointer
        # backpressure="block": every snapshot reaches zccd's EMA, so a
        # resumed run's EMA equals an uninterrupted one's.
        ckpt = Checkpointer(model, optimizer, job_id=args.job, socket=args.socket,
                            root=args.root, save_every=args.save_every,
                            ema_decay=args.ema_decay, state={"batches": batches},
                            backpressure="block")
        restored = ckpt.restore()
        print("restored=%s from=%s" % (restored, ckpt.restored_from), flush=True)
        start = (restored or 0) + 1

    model.train()
    for step in range(start, args.steps + 1):
        x, y = batches.next()
        loss = (model(x) - y).square().mean()
        loss.backward()
        optimizer.step()        # the Checkpointer fences here first
        optimizer.clear_grad()
        sched.step()
        result = ckpt.step(step) if ckpt is not None else "off"
        print("step=%d loss=%s snapshot=%s" % (step, float(loss).hex(), result), flush=True)
        if step == args.pause_after:
            if ckpt is not None:
                ckpt.flush()
            print("paused", flush=True)
            while True:
                signal.pause()  # a test kills this process here

    if ckpt is not None:
        ckpt.flush()
        if args.ema_decay > 0:
            ema = ckpt.ema_state_dict()
            print("ema_step=%s ema_tensors=%d" % (ckpt.ema_step, len(ema)), flush=True)
        ckpt.close()


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
    print("done in %.1f s" % (time.monotonic() - t0), flush=True)
