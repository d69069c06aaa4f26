"""A Paddle trainer whose state is spread over ranks, checkpointed with
zcc.paddle; started (one process per rank, Paddle's launcher environment)
by paddle_sharded_test.py.

    python paddle_sharded_worker.py --socket S --root R --job J \\
        --layout dist|sharding|plain --steps N [--save-every K] \\
        [--kill-after K] [--out PREFIX]

The model: Linear(5, 6), tanh, Linear(6, 3), AdamW with a StepDecay
schedule, zccd's EMA. Layouts:
  dist:     auto-parallel DistTensors on a 1-D mesh of every rank: both
            weights Shard(0) (row-parallel; the first one's 5 rows are cut
            3 and 2 on two ranks), the biases Replicate(); Paddle places
            their accumulators likewise.
  sharding: fleet's sharding stage 1 (sharding_degree = world size): every
            rank holds every parameter and the optimizer state of the
            parameters it owns only.
  plain:    one process, nothing sharded.
Every rank trains on the same batches. Restores (printing "restored=<step>
from=<where>"), trains to --steps (printing "loss <step> <repr>"), and with
--out writes PREFIX.r<rank>.npz: every registered tensor as the global
tensor (DistTensors gathered, sharded state merged from every rank), and
zccd's EMA likewise. --kill-after K: SIGKILL right after step K's snapshot is
handed to zccd.
"""

import argparse
import os
import signal

import numpy as np
import paddle
import paddle.distributed as dist

from zcc.paddle import Checkpointer


def batch(step):
    rs = np.random.RandomState(step)
    return (paddle.to_tensor(rs.rand(4, 5).astype("float32")),
            paddle.to_tensor(rs.rand(4, 3).astype("float32")))


def full(t, mesh):
    """The global value of `t` as a NumPy array (collective for DistTensors)."""
    if t.is_dist():
        t = dist.reshard(t, mesh, [dist.Replicate()])._local_value()
    return t.numpy().copy()


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--socket", "--root", "--job", "--layout"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--save-every", type=int, default=2)
    ap.add_argument("--kill-after", type=int, default=0)
    args = ap.parse_args()

    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    paddle.set_device("cpu")
    mesh = None
    if args.layout == "sharding":
        from paddle.distributed import fleet
        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1,
                                   "sharding_degree": world}
        fleet.init(is_collective=True, strategy=strategy)
    elif world > 1:
        dist.init_parallel_env()
    paddle.seed(7)
    model = paddle.nn.Sequential(paddle.nn.Linear(5, 6), paddle.nn.Tanh(), paddle.nn.Linear(6, 3))
    if args.layout == "dist":
        mesh = dist.ProcessMesh(list(range(world)), dim_names=["x"])
        # Row-parallel twice (Paddle's weights are [in, out]): the first
        # weight's 5 rows cut unevenly.
        model[0].weight = dist.shard_tensor(model[0].weight, mesh, [dist.Shard(0)])
        model[0].bias = dist.shard_tensor(model[0].bias, mesh, [dist.Replicate()])
        model[2].weight = dist.shard_tensor(model[2].weight, mesh, [dist.Shard(0)])
        model[2].bias = dist.shard_tensor(model[2].bias, mesh, [dist.Replicate()])
    sched = paddle.optimizer.lr.StepDecay(learning_rate=0.05, step_size=3, gamma=0.7)
    opt = paddle.optimizer.AdamW(learning_rate=sched, parameters=model.parameters(),
                                 weight_decay=0.01)
    if args.layout == "sharding":
        model = fleet.distributed_model(model)
        opt = fleet.distributed_optimizer(opt)
    ck = Checkpointer(model, opt, job_id=args.job, socket=args.socket, root=args.root,
                      save_every=args.save_every, ema_decay=0.9, backpressure="block")
    restored = ck.restore()
    print("restored=%s from=%s" % (restored, ck.restored_from), flush=True)
    for step in range((restored or 0) + 1, args.steps + 1):
        x, target = batch(step)
        if mesh is not None:
            x = dist.shard_tensor(x, mesh, [dist.Replicate()])
            target = dist.shard_tensor(target, mesh, [dist.Replicate()])
        loss = (model(x) - target).square().mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        sched.step()
        ck.step(step)
        print("loss %d %r" % (step, float(full(loss, mesh) if mesh is not None else loss)),
              flush=True)
        if step == args.kill_after:
            ck.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    ck.flush()
    state = {name: full(t, mesh) for name, t in ck._params.items()}
    for _, _, t, name in ck._accumulators:
        state[name] = full(t, mesh)
    for name, t in ck.ema_state_dict(include_buffers=False).items():
        state["ema." + name] = full(t, mesh)
    state["lr"] = np.array(ck._opt.get_lr())
    if world > 1:
        # Sharded optimizer state, and the EMA of what another replica
        # writes, are on one rank each: every rank's, merged.
        everyone = []
        dist.all_gather_object(everyone, state)
        for theirs in everyone:
            for name, value in theirs.items():
                if name in state and not np.array_equal(state[name], value):
                    raise SystemExit("rank states disagree on %s" % name)
                state[name] = value
    ck.close()
    if args.out:
        np.savez("%s.r%d.npz" % (args.out, rank), **state)


if __name__ == "__main__":
    main()
