"""Data-parallel MoE with zcc.paddle (Paddle's venv): DP 2 x EP 2 over 4
processes (gloo), experts checkpointed under their global ids.

All four ranks are SIGKILLed after step 5 and run again: they restore step 5
from zccd's memory together and end equal to an uninterrupted run, element
for element (parameters, AdamW state, EMA). After a zccd restart the
committed step 8 restores from disk on DP 2 x EP 2, on DP 4 x EP 1 (every
expert on every rank) and in one process, each expert found by its global id
whichever rank wrote it. The step holds each expert once however many
replicas held it: its bytes equal the model's unique bytes.
"""

import os
import sys
import tempfile

import numpy as np
from safetensors import safe_open

from paddle_test import launch, restored_line
from zcc_testing import run_tests
from zccd_process import Zccd

HERE = os.path.dirname(os.path.abspath(__file__))


def moe_ranks(d, job, world, ep, out, steps=8, kill_after=0):
    return launch([[sys.executable, "-u", os.path.join(HERE, "paddle_moe_worker.py"),
                    "--socket", d.socket, "--root", d.root, "--job", job, "--ep", str(ep),
                    "--steps", str(steps), "--kill-after", str(kill_after), "--out", out]
                   for _ in range(world)])


def dumps(prefix, world):
    return [dict(np.load("%s.r%d.npz" % (prefix, r))) for r in range(world)]


def union(states):
    """{name: value} over ranks; replicas must agree."""
    out = {}
    for state in states:
        for name, value in state.items():
            if name in out:
                assert np.array_equal(out[name], value), "replicas of %s differ" % name
            out[name] = value
    return out


def test_dp_moe_resumes_exactly_and_restores_into_other_layouts():
    with tempfile.TemporaryDirectory(prefix="zccmoe") as tmp, Zccd("pdmoe") as d:
        for code, out in moe_ranks(d, "ref", 4, 2, tmp + "/ref"):
            assert code == 0, out
        ref = dumps(tmp + "/ref", 4)
        want = union(ref)
        experts = sorted({k.split(".")[2] for k in want if k.startswith("moe.experts.")})
        assert experts == ["0", "1", "2", "3"], experts

        for code, out in moe_ranks(d, "moe", 4, 2, tmp + "/x", kill_after=5):
            assert code == -9, out
        for code, out in moe_ranks(d, "moe", 4, 2, tmp + "/resumed"):
            assert code == 0, out
            assert restored_line(out) == "restored=5 from=memory", out
        for r, (a, b) in enumerate(zip(ref, dumps(tmp + "/resumed", 4))):
            assert sorted(a) == sorted(b), r
            for name in a:
                assert np.array_equal(a[name], b[name]), "rank %d: %s differs" % (r, name)
        print("  DP 2 x EP 2: killed after 5, resumed from memory, %d arrays bit-exact"
              % sum(len(a) for a in ref))

        # The committed step 8 holds every tensor once: model and optimizer
        # shards (the EMA has its own) against the model's unique bytes.
        step = os.path.join(d.root, "ref", "step-00000008")
        stored = {}
        for f in sorted(os.listdir(step)):
            if f.endswith(".safetensors") and not f.startswith("ema-"):
                with safe_open(os.path.join(step, f), "np") as st:
                    for name in st.keys():
                        assert name not in stored, "%s written twice" % name
                        stored[name] = st.get_tensor(name)
        unique = {k: v for k, v in want.items() if not k.startswith("ema.")}
        assert sorted(stored) == sorted(unique), (sorted(stored), sorted(unique))
        assert sum(v.nbytes for v in stored.values()) == sum(v.nbytes for v in unique.values())
        for name, value in unique.items():
            assert np.array_equal(stored[name], value), name
        print("  step 8: %d tensors, %d bytes, each once"
              % (len(stored), sum(v.nbytes for v in stored.values())))

        d.stop()
        d.start()  # nothing in memory: every layout reads the disk
        for world, ep in ((4, 2), (4, 1), (1, 1)):
            prefix = "%s/disk-%d-%d" % (tmp, world, ep)
            for code, out in moe_ranks(d, "ref", world, ep, prefix):
                assert code == 0, out
                assert restored_line(out) == "restored=8 from=disk", out
            got = dumps(prefix, world)
            for r, state in enumerate(got):
                for name, value in state.items():
                    assert np.array_equal(value, want[name]), \
                        "DP %d x EP %d rank %d: %s" % (world // ep, ep, r, name)
            assert sorted(union(got)) == sorted(want), (world, ep)
            print("  DP %d x EP %d: step 8 restored from disk, every expert by its global id, "
                  "EMA included" % (world // ep, ep))


if __name__ == "__main__":
    run_tests(globals())
