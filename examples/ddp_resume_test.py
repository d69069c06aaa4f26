"""Two DDP ranks (gloo, CPU) of examples/train_mlp.py against one real zccd.

Parameters and optimizer state are DATA_PARALLEL replicas: the committed step
must hold each model tensor exactly once across the two ranks' shards, both
ranks' manifests, and load with safetensors. Then both ranks are SIGKILLed
while paused after step 25 (step 20 committed), restarted, and must restore
step 25 from zccd's memory (each rank what it writes, the rest by broadcast)
and reproduce the uninterrupted run's losses (per rank), final parameters
and per-rank EMA bit for bit; and again with rank 1's newest snapshot one
step behind, where both must agree on step 24.
"""

import json
import os
import tempfile

from safetensors import safe_open

import trainer_runs
from resume_test import same_tensors
from zccd_process import Zccd

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "train_mlp.py")
STEPS, WORLD = 30, 2


free_port = trainer_runs.free_port


def start_ranks(args, world=WORLD):
    return trainer_runs.start_ranks(SCRIPT, args, world)


def run_ranks(args, timeout=300, world=WORLD):
    return trainer_runs.run_ranks(SCRIPT, args, world, timeout=timeout)


def run_ranks_and_kill(args, timeout=120, world=WORLD):
    return trainer_runs.run_ranks_and_kill(SCRIPT, args, world, timeout=timeout)


def main():
    out = tempfile.mkdtemp(prefix="zccddp.", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
    with Zccd("ddp") as d:
        common = ["--socket", d.socket, "--root", d.root, "--steps", str(STEPS),
                  "--save-every", "10", "--ema-decay", "0.9", "--backpressure", "block"]
        full = run_ranks(common + ["--job", "full", "--dump", os.path.join(out, "full")])
        for rank, (losses, vals) in enumerate(full):
            assert sorted(losses) == list(range(1, STEPS + 1)), (rank, losses)
        assert full[0][0] != full[1][0], "the ranks should see different data"

        step_dir = os.path.join(d.job_dir("full"), "step-%08d" % STEPS)
        with open(os.path.join(step_dir, "model.safetensors.index.json")) as f:
            weight_map = json.load(f)["weight_map"]
        shards = set(weight_map.values())
        assert shards == {"model-r00000.safetensors", "model-r00001.safetensors"}, shards
        seen = []
        for shard in shards:
            with safe_open(os.path.join(step_dir, shard), framework="pt") as f:
                seen += [k for k in f.keys()]
        assert sorted(seen) == sorted(weight_map), "replicated tensors must be written once"
        for r in range(WORLD):
            assert os.path.exists(os.path.join(step_dir, "r%05d.manifest.json" % r))
        ema_counts = [int(v["ema_tensors"]) for _, v in full]
        assert sum(ema_counts) == len(weight_map) and min(ema_counts) > 0, ema_counts
        print("2 ranks: %d model tensors written once across %d shards; EMA split %s"
              % (len(weight_map), len(shards), ema_counts))

        # killed: both ranks' newest snapshot (step 25) is in zccd's memory;
        # skewed: rank 1 took no snapshot of step 25, so the ranks agree on
        # step 24, which both still hold in memory. Each rank restores only
        # the replicated tensors it writes and receives the others from the
        # other rank.
        for job, extra, expect in (("killed", [], 25), ("skewed", ["--last-snapshot", "1:24"], 24)):
            first = run_ranks_and_kill(common + ["--job", job, "--pause-after", "25",
                                                 "--wait-commit", "20"] + extra)
            for rank in range(WORLD):
                assert all(first[rank][s] == full[rank][0][s] for s in first[rank]), rank
            d.wait_latest(job, 20)
            second = run_ranks(common + ["--job", job, "--dump", os.path.join(out, job)])
            for rank, (losses, vals) in enumerate(second):
                assert vals["restored"] == str(expect), (rank, vals, d.log())
                assert vals["from"] == "memory", (rank, vals, d.log())
                assert sorted(losses) == list(range(expect + 1, STEPS + 1)), (rank, sorted(losses))
                diff = [s for s in losses if losses[s] != full[rank][0][s]]
                assert not diff, "rank %d: losses differ after resuming at %s" % (rank, diff)
                assert vals["samples_seen"] == str(STEPS * 32 * WORLD), vals
                # (The EMA read back is of the last step, not a read that
                # timed out before it was folded in.)
                assert vals["ema_step"] == str(STEPS), (rank, vals)
                for what in ("final", "ema"):
                    same_tensors(os.path.join(out, "full", "rank%d" % rank, what + ".safetensors"),
                                 os.path.join(out, job, "rank%d" % rank, what + ".safetensors"),
                                 "%s rank %d %s" % (job, rank, what))
            print("2 ranks (%s): SIGKILL after step 25, both restored step %d from memory, losses "
                  "%d..%d, final parameters and EMA bit-identical to the uninterrupted run"
                  % (job, expect, expect + 1, STEPS))
        assert d.stop() == 0, d.log()
    print("ddp_resume_test: OK")


if __name__ == "__main__":
    main()
