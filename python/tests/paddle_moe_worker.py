"""A data-parallel MoE trainer checkpointed with zcc.paddle, started (one
process per rank, Paddle's launcher environment) by paddle_moe_test.py.

    python paddle_moe_worker.py --socket S --root R --job J --ep EP --steps N \\
        [--save-every K] [--kill-after K] --out PREFIX

The model: a dense layer replicated on every rank and 4 experts split over
each data-parallel group of EP ranks (zcc.paddle.Experts). The dense layer
trains on a batch every rank draws alike; expert g on a batch drawn from g
and the step, so that its data-parallel replicas stay identical without
collectives. Restores (printing "restored=<step|None> from=<memory|disk>"),
trains to --steps, and writes PREFIX.r<rank>.npz with every registered tensor
and zccd's EMA by checkpoint name (global expert ids). --kill-after K:
SIGKILL right after step K's snapshot is handed to zccd.
"""

import argparse
import os
import signal

import numpy as np
import paddle

from zcc.paddle import Checkpointer, Experts

EXPERTS = 4


class Net(paddle.nn.Layer):
    def __init__(self, experts_per_rank):
        super().__init__()
        self.dense = paddle.nn.Linear(6, 6)
        self.moe = paddle.nn.Layer()
        self.moe.experts = paddle.nn.LayerList([paddle.nn.Linear(6, 6)
                                                for _ in range(experts_per_rank)])


def batch(seed):
    return paddle.to_tensor(np.random.RandomState(seed).rand(4, 6).astype("float32"))


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--socket", "--root", "--job", "--out"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--ep", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--save-every", type=int, default=2)
    ap.add_argument("--kill-after", type=int, default=0)
    args = ap.parse_args()

    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    if world > 1:
        paddle.distributed.init_parallel_env()
    paddle.seed(7)
    per_rank = EXPERTS // args.ep
    model = Net(per_rank)
    opt = paddle.optimizer.AdamW(learning_rate=0.01, parameters=model.parameters())
    experts = Experts("moe.experts", experts_per_rank=per_rank, ep_size=args.ep)
    ck = Checkpointer(model, opt, job_id=args.job, socket=args.socket, root=args.root,
                      save_every=args.save_every, ema_decay=0.9, moe=experts,
                      backpressure="block")
    restored = ck.restore()
    print("restored=%s from=%s" % (restored, ck.restored_from), flush=True)
    for step in range((restored or 0) + 1, args.steps + 1):
        loss = model.dense(batch(step)).square().mean()
        for i, expert in enumerate(model.moe.experts):
            loss = loss + expert(batch(1000 * experts.global_id(i) + step)).square().mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        ck.step(step)
        print("loss %d %r" % (step, float(loss)), flush=True)
        if step == args.kill_after:
            ck.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    ck.flush()
    state = {name: t.numpy().copy() for name, t in ck._params.items()}
    for _, _, t, name in ck._accumulators:
        state[name] = t.numpy().copy()
    for name, t in ck.ema_state_dict(include_buffers=False).items():
        state["ema." + name] = t.numpy()
    ck.close()
    np.savez("%s.r%d.npz" % (args.out, rank), **state)


if __name__ == "__main__":
    main()
