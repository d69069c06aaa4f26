"""examples/train_paddle.py with a real zccd: SIGKILLed while paused after
step 17 and run again, once with zccd up (restores step 17 from its memory)
and once after a zccd restart (restores step 10 from disk); every loss before
the kill and after the resume equals a run without zcc, bit for bit."""

import os

import trainer_runs
from zccd_process import Zccd

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    with Zccd("pdex") as d:
        trainer_runs.check_kill_and_resume(os.path.join(HERE, "train_paddle.py"), d)
    print("paddle_resume_test: passed")


if __name__ == "__main__":
    main()
