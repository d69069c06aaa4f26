"""A Paddle trainer checkpointed with zcc.paddle, started by paddle_test.py.

    python paddle_worker.py --socket S --root R --job J --optimizer adamw \\
        --steps 8 --save-every 2 [--kill-after K] [--rank R --world W] --out OUT.npz

Builds an MLP with BatchNorm and Dropout (its forward pass draws from Paddle's
generator), the optimizer named, a StepDecay schedule, a `state` object and a
user_state; restores (printing "restored=<step|None> from=<memory|disk>");
trains to --steps, drawing from Paddle's, NumPy's and Python's generators
every step; prints "loss <step> <repr>" per step. With --kill-after K it sends
itself SIGKILL right after step K's snapshot is handed to zccd. Backpressure
"block": every snapshot reaches zccd's EMA (with "skip" a snapshot zccd has
not taken in yet may be replaced, and the EMA then depends on timing).
Otherwise it
writes OUT.npz: every registered tensor (the model's state dict, the
optimizer's accumulators, by checkpoint name), zccd's EMA, the learning rate,
the counter and the user_state. Ranks of a --world W job (Paddle's
launcher environment, set by the test) join Paddle's process group and train
the same model on the same batches: data-parallel replicas, as
paddle.DataParallel keeps them.
"""

import argparse
import os
import random
import signal

import numpy as np
import paddle

from zcc.paddle import Checkpointer


class Counter:
    """A `state` object: how many batches were seen, and when."""

    def __init__(self):
        self.seen = 0
        self.history = []

    def state_dict(self):
        return {"seen": self.seen, "history": list(self.history)}

    def load_state_dict(self, state):
        self.seen = state["seen"]
        self.history = list(state["history"])


def build(optimizer, seed=7):
    paddle.seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    model = paddle.nn.Sequential(paddle.nn.Linear(6, 16), paddle.nn.BatchNorm1D(16),
                                 paddle.nn.ReLU(), paddle.nn.Dropout(0.2), paddle.nn.Linear(16, 3))
    sched = paddle.optimizer.lr.StepDecay(learning_rate=0.05, step_size=3, gamma=0.7)
    params = model.parameters()
    if optimizer == "momentum":
        opt = paddle.optimizer.Momentum(learning_rate=sched, momentum=0.9, parameters=params)
    elif optimizer == "sgd":
        opt = paddle.optimizer.SGD(learning_rate=sched, parameters=params)
    elif optimizer == "adam":
        opt = paddle.optimizer.Adam(learning_rate=sched, parameters=params)
    elif optimizer == "adamw":
        opt = paddle.optimizer.AdamW(learning_rate=sched, parameters=params, weight_decay=0.01)
    else:
        raise SystemExit("unknown optimizer " + optimizer)
    return model, opt, sched


def registered(ck):
    """Every registered tensor's current value, by checkpoint name."""
    out = {"model." + k: v.numpy().copy() for k, v in ck.model.state_dict().items()}
    for _, _, t, name in ck._accumulators:
        out[name] = t.numpy().copy()
    return out


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--socket", "--root", "--job", "--optimizer", "--out"):
        ap.add_argument(flag, required=flag != "--out")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--save-every", type=int, default=2)
    ap.add_argument("--kill-after", type=int, default=0)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    args = ap.parse_args()

    if args.world > 1:
        paddle.distributed.init_parallel_env()  # gloo on the CPU: restore() agrees over it
    model, opt, sched = build(args.optimizer)
    counter = Counter()
    user_state = {"epoch": 0}
    ck = Checkpointer(model, opt, job_id=args.job, socket=args.socket, root=args.root,
                      save_every=args.save_every, ema_decay=0.9, state={"counter": counter},
                      user_state=user_state, backpressure="block", rank=args.rank,
                      world_size=args.world)
    restored = ck.restore()
    print("restored=%s from=%s own_state=%s epoch=%s ema_step=%s"
          % (restored, ck.restored_from, ck.restored_rank_state, user_state["epoch"],
             ck.ema_step), flush=True)
    if restored is not None:
        # Whatever this process's generators were, the checkpoint's count (a
        # rank new to the job takes rank 0's user_state, and keeps its counter).
        assert user_state["epoch"] == restored // 3, user_state
        assert counter.seen == (restored if ck.restored_rank_state else 0), counter.seen
    model.train()
    for step in range((restored or 0) + 1, args.steps + 1):
        x = paddle.randn([8, 6]) + float(np.random.rand()) + random.random()
        target = paddle.randn([8, 3])
        loss = (model(x) - target).square().mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        sched.step()
        counter.seen += 1
        counter.history.append(step)
        user_state["epoch"] = step // 3
        ck.step(step)
        print("loss %d %r" % (step, float(loss)), flush=True)
        if step == args.kill_after:
            ck.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    ck.flush()
    state = registered(ck)
    for name, t in ck.ema_state_dict(include_buffers=False).items():
        state["ema." + name] = t.numpy()
    state["lr"] = np.array(opt.get_lr())
    state["counter"] = np.array(counter.history)
    state["epoch"] = np.array(user_state["epoch"])
    ck.close()
    if args.out:
        np.savez(args.out, **state)


if __name__ == "__main__":
    main()
