"""zcc.accelerate with a real zccd: examples/train_accelerate.py (a tiny Llama
built from a config, an Accelerate training loop on the CPU, AdamW, a
LambdaLR schedule, attention dropout, a shuffling data loader made stateful
by Accelerate) trained to step 30:

  baseline   without zcc
  killed     with zcc (save_every=10), SIGKILLed while paused after step 17,
             restarted: restores step 17 from zccd's memory, trains 18..30
  restarted  the same, with zccd restarted in between: restores step 10
             from disk, trains 11..30

Every step's loss after the resume must equal the baseline's bit for bit
(the model, the optimizer, the schedule, the generators and the loader's
position all came back), and zcc must not change the losses before it
(trainer_runs.check_kill_and_resume).
"""

import os

from trainer_runs import check_kill_and_resume
from zccd_process import Zccd

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_accelerate.py")


def main():
    with Zccd("accel") as d:
        check_kill_and_resume(SCRIPT, d)
        assert d.stop() == 0, d.log()
    print("accelerate_resume_test: OK")


if __name__ == "__main__":
    main()
