"""An integration example with a real zccd, SIGKILLed and resumed:

    integration_resume_test.py train_accelerate.py   (zcc.accelerate)
    integration_resume_test.py train_lightning.py    (zcc.lightning)

The example (a tiny Llama built from a config, trained on the CPU with
AdamW, a LambdaLR schedule, attention dropout and a stateful loader that
shuffles with a generator of its own) runs to step 30:

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
import sys

from trainer_runs import check_kill_and_resume
from zccd_process import Zccd


def main():
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), sys.argv[1])
    with Zccd("integration") as d:
        check_kill_and_resume(script, d)
        assert d.stop() == 0, d.log()
    print("integration_resume_test %s: OK" % sys.argv[1])


if __name__ == "__main__":
    main()
