"""Resume exactness of examples/train_mlp.py with a real zccd.

Runs, all to step 40 (save_every=10, EMA decay 0.9, BatchNorm buffers, AdamW +
OneCycleLR, dropout from the torch RNG, batches from torchdata's
StatefulDataLoader shuffling a fixed dataset):

  baseline     without zcc at all
  full         with zcc, uninterrupted
  killed       with zcc; SIGKILLed while paused after step 25 (step 20 committed),
               then restarted: restores step 20, trains 21..40
  on_failure   as killed, but with persist_on_failure: zccd persists the newest
               snapshot (step 25) when the trainer dies; the restart restores 25

and checks, bit for bit: zcc does not change the losses (full == baseline);
every run's per-step losses equal the uninterrupted run's; the final
parameters and buffers equal; zccd's EMA after resuming equals the
uninterrupted run's EMA.

Snapshots use Backpressure.BLOCK: zccd folds every *ingested* snapshot into the
EMA, and with SKIP a slow moment could drop one from one run but not another.
"""

import os
import tempfile

from safetensors.torch import load_file

import trainer_runs
from zccd_process import Zccd

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "train_mlp.py")
STEPS = 40


def run(args, timeout=300):
    return trainer_runs.run(SCRIPT, args, timeout=timeout)


def run_and_kill(args, timeout=120):
    """Starts a trainer that pauses after a step, SIGKILLs it there, reaps it."""
    return trainer_runs.run_and_kill(SCRIPT, args, timeout=timeout)[0]


def tensors_bytes(path):
    return {k: v.numpy().tobytes() for k, v in load_file(path).items()}


def same_tensors(a_path, b_path, what):
    a, b = tensors_bytes(a_path), tensors_bytes(b_path)
    assert a.keys() == b.keys(), (what, sorted(a), sorted(b))
    bad = [k for k in a if a[k] != b[k]]
    if bad:
        # How they differ, for the report: elements and the largest gap.
        ta, tb = load_file(a_path), load_file(b_path)
        how = ["%s: %d of %d elements, max |diff| %g" % (
            k, int((ta[k] != tb[k]).sum()), ta[k].numel(),
            float((ta[k].double() - tb[k].double()).abs().max())) for k in bad]
        raise AssertionError("%s differ bitwise: %s" % (what, "; ".join(how)))
    return len(a)


def main():
    out = tempfile.mkdtemp(prefix="zccresume.", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
    with Zccd("resume") as d:
        common = ["--socket", d.socket, "--root", d.root, "--steps", str(STEPS),
                  "--save-every", "10", "--ema-decay", "0.9", "--batchnorm",
                  "--backpressure", "block", "--dataloader"]

        baseline, _, _ = run(common + ["--no-zcc"])
        full, vals, log = run(common + ["--job", "full", "--dump", os.path.join(out, "full")])
        assert sorted(full) == list(range(1, STEPS + 1)), log
        assert vals["restored"] == "None", vals
        assert full == baseline, "zcc changed the training numerics"
        assert vals["ema_step"] == str(STEPS), vals
        print("uninterrupted: %d steps, losses identical to training without zcc" % STEPS)

        # killed: zccd still holds the trainer's newest snapshot (step 25) and
        # its EMA, and serves them from memory; on_failure: the same, and
        # step 25 was also persisted when zccd noticed the death; restarted:
        # zccd restarted in between (its memory gone), so the restore reads
        # the last committed step (20) from disk.
        for job, extra, expect, source in (("killed", [], 25, "memory"),
                                           ("on_failure", ["--persist-on-failure"], 25, "memory"),
                                           ("restarted", [], 20, "disk")):
            first = run_and_kill(common + ["--job", job, "--pause-after", "25",
                                           "--wait-commit", "20"] + extra)
            assert sorted(first) == list(range(1, 26)), sorted(first)
            assert all(first[s] == full[s] for s in first), "%s: losses before the kill differ" % job
            # The restart must find the step zccd is expected to have (for
            # on_failure: persisted when zccd noticed the trainer's death).
            d.wait_latest(job, 25 if job == "on_failure" else 20)
            if job == "restarted":
                assert d.stop() == 0, d.log()
                d.start()
            dump = os.path.join(out, job)
            second, vals, log = run(common + ["--job", job, "--dump", dump] + extra)
            assert vals["restored"] == str(expect), (vals, log, d.log())
            assert vals["from"] == source, (vals, log, d.log())
            assert sorted(second) == list(range(expect + 1, STEPS + 1)), log
            diff = [s for s in second if second[s] != full[s]]
            assert not diff, "%s: losses after resuming differ at steps %s" % (job, diff)
            assert vals["samples_seen"] == full_samples(STEPS), vals
            assert vals["ema_step"] == str(STEPS), vals
            n = same_tensors(os.path.join(out, "full", "final.safetensors"),
                             os.path.join(dump, "final.safetensors"), job + " final parameters")
            m = same_tensors(os.path.join(out, "full", "ema.safetensors"),
                             os.path.join(dump, "ema.safetensors"), job + " EMA")
            print("%s: SIGKILL after step 25, restored step %d from %s, losses %d..%d, %d final "
                  "tensors and %d EMA tensors bit-identical to the uninterrupted run"
                  % (job, expect, source, expect + 1, STEPS, n, m))
        assert d.stop() == 0, d.log()
    print("resume_test: OK")


def full_samples(steps):
    return str(steps * 32)


if __name__ == "__main__":
    main()
