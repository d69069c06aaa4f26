"""State spread over ranks with zcc.paddle (Paddle's venv, gloo on the CPU):
auto-parallel DistTensors and fleet's sharding stage 1.

For each layout two ranks are SIGKILLed after step 5 and run again: they
restore step 5 from zccd's memory and end equal to an uninterrupted run,
element for element (parameters, AdamW state, EMA, learning rate). The
uninterrupted run's step 8, where every piece is written once, then
restores in one process with nothing sharded, equal to the global tensors;
that process trains on to step 10, and two ranks of the same layout, started
by `python -m paddle.distributed.launch`, restore step 10 from it, each
taking its own piece (a DistTensor's rows, a sharding rank's parameters'
optimizer state).
"""

import os
import sys
import tempfile

import numpy as np
from safetensors import safe_open

from paddle_moe_test import dumps, union
from paddle_test import launch, launched, losses, restored_line
from zcc_testing import run_tests
from zccd_process import Zccd

HERE = os.path.dirname(os.path.abspath(__file__))


def run(d, job, layout, world, out=None, steps=8, kill_after=0, launcher=False):
    """The worker on `world` ranks, started as paddle.distributed.launch
    starts its workers (with `launcher`, by the launcher itself)."""
    args = [os.path.join(HERE, "paddle_sharded_worker.py"), "--socket", d.socket, "--root",
            d.root, "--job", job, "--layout", layout, "--steps", str(steps),
            "--kill-after", str(kill_after)] + (["--out", out] if out else [])
    if launcher:
        return launched(args, world)
    return launch([[sys.executable, "-u"] + args for _ in range(world)])


def stored_pieces(d, job, step):
    """{name: [(shard file, array)]} of a committed step's model and
    optimizer shards (a piece of a global tensor under the tensor's name in
    the file of the rank that wrote it)."""
    path = os.path.join(d.root, job, "step-%08d" % step)
    stored = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors") and not f.startswith("ema-"):
            with safe_open(os.path.join(path, f), "np") as st:
                for name in st.keys():
                    stored.setdefault(name, []).append((f, st.get_tensor(name)))
    return stored


def check_layout(d, tmp, layout):
    ref_runs = run(d, layout + "-ref", layout, 2, tmp + "/ref")
    for code, out in ref_runs:
        assert code == 0, out
    ref = dumps(tmp + "/ref", 2)
    want = union(ref)
    assert any(k.endswith(".moment1") for k in want) and "ema.0.weight" in want, sorted(want)

    # Killed after 5, resumed from memory: bit-exact against the
    # uninterrupted run, on every rank.
    for code, out in run(d, layout, layout, 2, kill_after=5):
        assert code == -9, out
    resumed = run(d, layout, layout, 2, tmp + "/resumed")
    for r, (code, out) in enumerate(resumed):
        assert code == 0, out
        assert restored_line(out) == "restored=5 from=memory", out
        assert losses(out) == {s: v for s, v in losses(ref_runs[r][1]).items() if s > 5}, out
    for r, (a, b) in enumerate(zip(ref, dumps(tmp + "/resumed", 2))):
        assert sorted(a) == sorted(b), r
        for name in a:
            assert np.array_equal(a[name], b[name]), "%s rank %d: %s differs" % (layout, r, name)

    # The uninterrupted run's step 8 holds every global tensor's elements
    # once: a whole tensor in one file, a cut one's pieces in their writers'.
    stored = stored_pieces(d, layout + "-ref", 8)
    for name, value in want.items():
        if name.startswith("ema.") or name == "lr":
            continue
        pieces = [a for _, a in stored[name]]
        assert sum(a.size for a in pieces) == value.size, (layout, name, [a.shape for a in pieces])
        if len(pieces) == 1:
            assert np.array_equal(pieces[0], value), "%s: step 8's %s" % (layout, name)

    # Into one process, nothing sharded: step 8 equals the global tensors.
    for code, out in run(d, layout + "-ref", "plain", 1, tmp + "/one8", steps=8):
        assert code == 0, out
        assert restored_line(out).startswith("restored=8 "), out
    one = dumps(tmp + "/one8", 1)[0]
    assert sorted(one) == sorted(want), (sorted(one), sorted(want))
    for name, value in want.items():
        assert np.array_equal(one[name], value), "%s into one process: %s" % (layout, name)
    # That process trains on to step 10 and commits it.
    for code, out in run(d, layout + "-ref", "plain", 1, tmp + "/one", steps=10):
        assert code == 0, out
        assert restored_line(out).startswith("restored=8 "), out

    # Back to two ranks of the layout: step 10, written by one process,
    # restored piece by piece.
    ten = dumps(tmp + "/one", 1)[0]
    for code, out in run(d, layout + "-ref", layout, 2, tmp + "/two", steps=10, launcher=True):
        assert code == 0, out
        assert restored_line(out).startswith("restored=10 "), out
    for r, state in enumerate(dumps(tmp + "/two", 2)):
        for name, value in state.items():
            assert np.array_equal(value, ten[name]), "%s rank %d from one process: %s" % (
                layout, r, name)
    print("  %s: resumed at 5 from memory bit-exact (%d arrays); step 8 restored in one "
          "process; step 10 from it on two ranks" % (layout, len(want)))
    return stored


def test_dist_tensors_resume_exactly_and_restore_into_other_layouts():
    with tempfile.TemporaryDirectory(prefix="zccpdt") as tmp, Zccd("pddt") as d:
        stored = check_layout(d, tmp, "dist")
        # Row-parallel weights in two pieces each, the first one's 5 rows
        # cut 3 and 2 (so are their moments); replicated biases once.
        assert [a.shape for _, a in stored["0.weight"]] == [(3, 6), (2, 6)], stored["0.weight"]
        assert [a.shape for _, a in stored["optimizer.state.0.weight.moment1"]] == \
            [(3, 6), (2, 6)]
        assert [a.shape for _, a in stored["2.weight"]] == [(3, 3), (3, 3)]
        assert len(stored["0.bias"]) == 1 and len(stored["optimizer.state.0.bias.moment1"]) == 1

def test_sharding_stage_1_state_is_written_by_its_owner():
    with tempfile.TemporaryDirectory(prefix="zccpsh") as tmp, Zccd("pdsh") as d:
        stored = check_layout(d, tmp, "sharding")
        # Each accumulator once, in the shard file of the rank that owns
        # its parameter, and both ranks own some.
        moments = {k: v for k, v in stored.items() if k.startswith("optimizer.state.")}
        assert all(len(v) == 1 for v in moments.values()), moments
        assert len({v[0][0] for v in moments.values()}) == 2, moments

if __name__ == "__main__":
    run_tests(globals())
