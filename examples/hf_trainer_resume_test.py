"""zcc.hf.ZccCallback with a real zccd and transformers.Trainer:
examples/train_hf_trainer.py (a tiny Llama built from a config, the Trainer
on the CPU, AdamW with a linear schedule and warmup, attention dropout,
the Trainer's shuffling sampler) trained to step 30:

  baseline  without zcc
  resumed   with ZccCallback (save_every=10), SIGKILLed while paused after
            step 17 (step 10 committed, its checkpoint-10 folder written),
            restarted with trainer.train(resume_from_checkpoint=True): the
            Trainer resumes from checkpoint-10, zcc restores step 10

Every loss after the resume and the final weights must equal the baseline's
bit for bit, and those before the kill too (zcc changes nothing). The same
with two DDP ranks (gloo), each rank's losses compared. Then a folder whose
step zccd no longer has fails the resume with the reason.
"""

import os
import shutil
import tempfile

from safetensors.torch import load_file

import trainer_runs
from zccd_process import Zccd

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "train_hf_trainer.py")
STEPS = 30


def run(args, expect_rc=0):
    losses, _, out = trainer_runs.run(SCRIPT, args, expect_rc=expect_rc)
    return losses, out


def same_weights(a, b):
    x, y = load_file(a), load_file(b)
    assert x.keys() == y.keys(), (sorted(x), sorted(y))
    bad = [k for k in x if not x[k].equal(y[k])]
    assert not bad, "final weights differ: %s" % bad
    return len(x)


def main():
    tmp = tempfile.mkdtemp(prefix="zcchf.", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
    with Zccd("hftrainer") as d:
        common = ["--socket", d.socket, "--root", d.root, "--steps", str(STEPS)]
        _, out, base_dump, zcc_dump = trainer_runs.check_folder_resume(
            SCRIPT, common, tmp, ["trainer_state.json", "rng_state.pth",
                                  "model.safetensors.index.json", "zcc.json"], ".safetensors")
        n = same_weights(base_dump, zcc_dump)
        print("resumed: SIGKILL after step 17, Trainer resumed from checkpoint-10 with zcc's step "
              "10, losses 11..%d and %d final weights bit-identical to the run without zcc"
              % (STEPS, n))

        # Two DDP ranks: the folder holds each rank's generators, and each
        # rank's losses after the resume are the uninterrupted run's.
        trainer_runs.check_ranks_folder_resume(SCRIPT, common, tmp, "hf-ddp", "torchrun")
        print("two DDP ranks: resumed from checkpoint-10 with both ranks' generators, every "
              "rank's losses 11..%d bit-identical" % STEPS)

        # Training that ran without zcc, with the Trainer's own checkpoints,
        # then with zcc: the Trainer resumes from its own checkpoint-20, whose
        # state stands (zcc has no step 20), and zcc goes on from it. Every
        # loss equals the Trainer's own resume without zcc (which is not the
        # uninterrupted run's: the Trainer's resume is not exact, zcc's is).
        own = os.path.join(tmp, "own")
        _, log = run(common + ["--no-zcc", "--out", own, "--steps", "20",
                               "--trainer-save-every", "10"])
        assert sorted(os.listdir(own)) == ["checkpoint-10", "checkpoint-20"], os.listdir(own)
        mig = os.path.join(tmp, "migrate")
        shutil.copytree(own, mig)
        plain, log = run(common + ["--no-zcc", "--trainer-resume", "--out", own])
        assert sorted(plain) == list(range(21, STEPS + 1)), log
        third, log = run(common + ["--job", "hf-migrate", "--out", mig])
        assert "resume=True" in log, log
        assert third == plain, "zcc changed the Trainer's own resume: %s" % [
            s for s in third if third.get(s) != plain.get(s)]
        assert os.path.isfile(os.path.join(mig, "checkpoint-30", "zcc.json")), os.listdir(mig)
        print("the Trainer's own checkpoint-20, then zcc: resumed from it as without zcc "
              "(losses 21..%d identical), zcc's checkpoint-30 written" % STEPS)

        # A folder naming a step zccd does not have: the resume stops with why.
        shutil.rmtree(os.path.join(d.root, "hf-trainer", "step-00000030"))
        _, log = run(common + ["--out", out, "--steps", str(STEPS + 5)], expect_rc=1)
        assert "cannot restore" in log and "checkpoint-<step>" in log, log
        print("a checkpoint folder whose zcc step is gone: refused with the reason")
        assert d.stop() == 0, d.log()
    print("hf_trainer_resume_test: OK")


if __name__ == "__main__":
    main()
