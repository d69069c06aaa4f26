"""zcc.paddleformers.ZccCallback with a real zccd and PaddleFormers' Trainer
(PaddleFormers' venv): examples/train_paddleformers.py (a tiny Llama built
from a config, the Trainer on the CPU, AdamW with a linear schedule and
warmup, the Trainer's shuffling sampler) trained to step 30:

  baseline  without zcc
  resumed   with ZccCallback (save_every=10), SIGKILLed while paused after
            step 17 (step 10 committed, its checkpoint-10 folder written),
            restarted with trainer.train(resume_from_checkpoint=
            get_last_checkpoint(output_dir)): the Trainer resumes from
            checkpoint-10, zcc restores step 10

Every loss after the resume and the final weights must equal the baseline's
bit for bit, and those before the kill too (zcc changes nothing). The same
with two data-parallel ranks (gloo), each rank's losses compared, resumed
under `python -m paddle.distributed.launch`. `zccctl
export` of the last step then loads with PaddleFormers' from_pretrained into
the trained weights (config.json stored with the job, Linear weights
transposed as the job's zcc_export.json asks).
Then a folder whose step zccd no longer has fails the resume with the
reason.
"""

import os
import shutil
import subprocess
import tempfile

import numpy as np

import trainer_runs
from zccd_process import Zccd

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "train_paddleformers.py")
STEPS = 30


def run(args, expect_rc=0):
    losses, _, out = trainer_runs.run(SCRIPT, args, expect_rc=expect_rc)
    return losses, out


def main():
    # (Paddle's tests run without $TEST_TMPDIR: run_python.sh says why.)
    tmp = tempfile.mkdtemp(prefix="zccpf.", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
    # PaddleFormers makes its home directory as it is imported (~/.paddleformers
    # by default); the test's sandbox may not let it write the user's home.
    os.environ.setdefault("PF_HOME", os.path.join(tmp, "paddleformers-home"))
    try:
        check(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("paddleformers_resume_test: OK")


def check(tmp):
    zccctl = os.path.join(os.path.dirname(os.environ["ZCCD"]), "..", "tools", "zccctl")
    with Zccd("pftrainer") as d:
        common = ["--socket", d.socket, "--root", d.root, "--steps", str(STEPS)]
        _, out, base_dump, zcc_dump = trainer_runs.check_folder_resume(
            SCRIPT, common, tmp, ["trainer_state.bin", "rng_state_0.pth", "scheduler.pdparams",
                                  "model_state.pdparams", "optimizer.pdopt", "zcc.json"], ".npz")
        want, got = np.load(base_dump), np.load(zcc_dump)
        assert sorted(want.files) == sorted(got.files)
        bad = [k for k in want.files if not np.array_equal(want[k], got[k])]
        assert not bad, "final weights differ: %s" % bad
        print("resumed: SIGKILL after step 17, Trainer resumed from checkpoint-10 with zcc's step "
              "10, losses 11..%d and %d final weights bit-identical to the run without zcc"
              % (STEPS, len(want.files)))

        # Two data-parallel ranks: the folder holds each rank's generators,
        # and each rank's losses after the resume are the uninterrupted run's.
        # (Resumed as users launch it: python -m paddle.distributed.launch.)
        trainer_runs.check_ranks_folder_resume(SCRIPT, common, tmp, "pf-dp", "paddle",
                                               resume_launched=True)
        print("two data-parallel ranks: resumed from checkpoint-10 with both ranks' generators, "
              "every rank's losses 11..%d bit-identical" % STEPS)

        # Exported, the last step loads with from_pretrained into the
        # trained weights.
        exported = os.path.join(tmp, "model")
        exported_log = subprocess.run(
            [zccctl, "export", os.path.join(d.job_dir("pf-llama"), "latest"), exported],
            check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
        assert "config.json" in os.listdir(exported), os.listdir(exported)
        import paddle
        from paddleformers.transformers import LlamaForCausalLM
        paddle.set_device("cpu")
        model = LlamaForCausalLM.from_pretrained(exported)
        loaded = {k: v.numpy() for k, v in model.state_dict().items()}
        assert sorted(loaded) == sorted(got.files), sorted(set(loaded) ^ set(got.files))
        bad = [k for k in loaded if not np.array_equal(loaded[k], got[k])]
        assert not bad, "exported weights differ from the trained model: %s" % bad
        # And the same logits as the trained weights give the model built
        # from the config.
        trained = LlamaForCausalLM(model.config)
        trained.set_state_dict({k: paddle.to_tensor(got[k]) for k in got.files})
        tokens = paddle.to_tensor(np.random.RandomState(5).randint(0, 256, (2, 16)))
        model.eval()
        trained.eval()
        a, b = model(tokens), trained(tokens)
        a, b = (x[0] if isinstance(x, (tuple, list)) else getattr(x, "logits", x) for x in (a, b))
        assert np.array_equal(a.numpy(), b.numpy()), "logits differ"
        assert "2-D tensor(s) written transposed" in exported_log, exported_log
        print("zccctl export: from_pretrained loads the %d trained weights (Linear weights "
              "transposed to Hugging Face's layout), identical logits" % len(loaded))

        # A folder naming a step zccd does not have: the resume stops with why.
        shutil.rmtree(os.path.join(d.root, "pf-llama", "step-00000030"))
        _, log = run(common + ["--out", out, "--steps", str(STEPS + 5)], expect_rc=1)
        assert "cannot restore" in log and "checkpoint-<step>" in log, log
        print("a checkpoint folder whose zcc step is gone: refused with the reason")
        assert d.stop() == 0, d.log()


if __name__ == "__main__":
    main()
