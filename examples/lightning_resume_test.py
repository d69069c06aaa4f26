"""zcc.lightning with a real zccd: examples/train_lightning.py (a tiny Llama
built from a config, a LightningModule trained on the CPU, AdamW, a
LambdaLR schedule stepped per batch, attention dropout, torchdata's
StatefulDataLoader shuffling with its own generator) trained to step 30:

  baseline   without zcc
  killed     with zcc (save_every=10), SIGKILLed while paused after step 17,
             restarted: restores step 17 from zccd's memory, trains 18..30
  restarted  the same, with zccd restarted in between: restores step 10
             from disk, trains 11..30

Every step's loss after the resume must equal the baseline's bit for bit
(the model, the optimizer, the schedule, the generators and the loader's
position all came back), and zcc must not change the losses before it.
"""

import os
import subprocess
import sys

from resume_test import parse
from zccd_process import Zccd

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "train_lightning.py")
STEPS = 30


def run(args, timeout=300):
    p = subprocess.run([sys.executable, "-u", SCRIPT] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError("train_lightning.py %s failed (%d):\n%s"
                             % (" ".join(args), p.returncode, p.stdout))
    return parse(p.stdout) + (p.stdout,)


def run_and_kill(args, timeout=120):
    p = subprocess.Popen([sys.executable, "-u", SCRIPT] + args, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    out = []
    try:
        for line in p.stdout:
            out.append(line)
            if line.strip() == "paused":
                break
        else:
            raise AssertionError("trainer exited before pausing:\n" + "".join(out))
    finally:
        p.kill()
        p.wait(timeout)
    assert p.returncode == -9, p.returncode
    return parse("".join(out))[0]


def main():
    with Zccd("lightning") as d:
        common = ["--socket", d.socket, "--root", d.root, "--steps", str(STEPS),
                  "--save-every", "10"]
        baseline, _, log = run(common + ["--no-zcc"])
        assert sorted(baseline) == list(range(1, STEPS + 1)), log
        assert len(set(baseline.values())) > STEPS // 2, "the losses hardly change: %s" % log
        for job, expect, source in (("killed", 17, "memory"), ("restarted", 10, "disk")):
            first = run_and_kill(common + ["--job", job, "--pause-after", "17"])
            assert sorted(first) == list(range(1, 18)), sorted(first)
            bad = [s for s in first if first[s] != baseline[s]]
            assert not bad, "%s: zcc changed the losses at steps %s" % (job, bad)
            d.wait_latest(job, 10)
            if job == "restarted":
                assert d.stop() == 0, d.log()
                d.start()
            second, vals, log = run(common + ["--job", job])
            assert vals["restored"] == str(expect), (vals, log, d.log())
            assert vals["from"] == source, (vals, log)
            assert sorted(second) == list(range(expect + 1, STEPS + 1)), log
            bad = [s for s in second if second[s] != baseline[s]]
            assert not bad, "%s: losses after resuming differ at steps %s\n%s" % (job, bad, log)
            print("%s: SIGKILL after step 17, restored step %d from %s, losses %d..%d "
                  "bit-identical to the run without zcc" % (job, expect, source, expect + 1, STEPS))
        assert d.stop() == 0, d.log()
    print("lightning_resume_test: OK")


if __name__ == "__main__":
    main()
