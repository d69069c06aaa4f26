"""The Hugging Face example end to end (examples/train_hf.py), with a real
zccd and real torchrun jobs (gloo, CPU):

  1. a tiny Llama trains with FSDP2 over 4 ranks, checkpointed every step
     with EMA, and is SIGKILLed (the whole torchrun process group) after
     step 6;
  2. torchrun with 2 ranks (another layout) resumes from the newest
     committed step (6) and trains on to step 10; its data counter (user
     state) shows that no step was lost or repeated;
  3. `zccctl export` writes the model and the EMA as Hugging Face
     directories: AutoModelForCausalLM.from_pretrained loads both; the
     model's weights equal the full state dict of the trained model
     (get_model_state_dict(full_state_dict=True)) exactly, and the EMA
     equals decay-weighted averages of the parameters after every step
     (recomputed here from per-step dumps) within float32 rounding.
Prints the restore and export times.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file

from zccd_process import Zccd

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "train_hf.py")
STEPS, KILL_AFTER, DECAY = 10, 6, 0.9


def torchrun(nproc, args, stdout=subprocess.PIPE):
    cmd = [sys.executable, "-W", "ignore", "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(nproc), SCRIPT] + args
    return subprocess.Popen(cmd, text=True, stdout=stdout, stderr=subprocess.STDOUT,
                            start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))


def losses(lines):
    return {int(l.split()[0][5:]): float.fromhex(l.split()[1][5:])
            for l in lines if l.startswith("step=")}


def main():
    out = tempfile.mkdtemp(prefix="zcchf.", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
    params = os.path.join(out, "params")
    zccctl = os.path.join(os.path.dirname(os.environ["ZCCD"]), "..", "tools", "zccctl")
    with Zccd("hf") as d:
        common = ["--socket", d.socket, "--root", d.root, "--steps", str(STEPS),
                  "--ema-decay", str(DECAY), "--dump-params", params]

        # 1. Four ranks, killed after step KILL_AFTER. (torchrun starts each
        # worker in a session of its own: the workers are killed by pid.)
        pause_dir = os.path.join(out, "paused")
        os.makedirs(pause_dir)
        log = open(os.path.join(out, "first.log"), "w+")
        p = torchrun(4, common + ["--pause-after", str(KILL_AFTER), "--pause-dir", pause_dir],
                     stdout=log)
        deadline = time.monotonic() + 240
        while len(os.listdir(pause_dir)) < 4 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = []
        for name in os.listdir(pause_dir):
            if name.endswith(".pid"):
                with open(os.path.join(pause_dir, name)) as f:
                    pids.append(int(f.read()))
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        log.seek(0)
        first = log.read().splitlines()
        log.close()
        assert len(pids) == 4, "the 4 ranks did not pause:\n" + "\n".join(first)
        assert sorted(losses(first)) == list(range(1, KILL_AFTER + 1)), first
        d.wait_latest("hf-llama", KILL_AFTER)
        print("4 ranks (FSDP2): trained steps 1..%d, SIGKILLed; step %d committed"
              % (KILL_AFTER, KILL_AFTER))

        # 2. Two ranks resume.
        final = os.path.join(out, "final.safetensors")
        p = torchrun(2, common + ["--dump-final", final])
        second, _ = p.communicate(timeout=300)
        assert p.returncode == 0, second
        second = second.splitlines()
        restored = [l for l in second if l.startswith("restored step")]
        assert restored and restored[0].startswith("restored step %d from disk on 2 ranks"
                                                   % KILL_AFTER), second
        assert sorted(losses(second)) == list(range(KILL_AFTER + 1, STEPS + 1)), second
        assert "sequences seen %d" % (KILL_AFTER * 4 * 4 + (STEPS - KILL_AFTER) * 4 * 2) in \
            "\n".join(second), second
        print("2 ranks (FSDP2): " + restored[0])
        d.wait_latest("hf-llama", STEPS)

        # 3. Export and load with transformers.
        from transformers import AutoModelForCausalLM
        step_dir = os.path.join(d.job_dir("hf-llama"), "step-%08d" % STEPS)
        times = {}
        for what in ("model", "ema"):
            start = time.monotonic()
            subprocess.run([zccctl, "export", step_dir, os.path.join(out, what), "--what", what],
                           check=True, stdout=subprocess.PIPE)
            times[what] = time.monotonic() - start
        model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "model"))
        want = load_file(final)
        got = model.state_dict()
        assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
        bad = [k for k in want if not torch.equal(got[k], want[k])]
        assert not bad, "exported weights differ from the trained model: %s" % bad
        ema_model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "ema"),
                                                         dtype=torch.float32)
        ema = None
        for step in range(1, STEPS + 1):
            p_step = load_file(os.path.join(params, "step-%d.safetensors" % step))
            ema = {k: v.float().clone() for k, v in p_step.items()} if ema is None else \
                {k: DECAY * ema[k] + (1 - DECAY) * v.float() for k, v in p_step.items()}
        got_ema = ema_model.state_dict()
        err = max((got_ema[k] - ema[k]).abs().max().item() for k in ema)
        moved = max((got_ema[k] - want[k]).abs().max().item() for k in ema)
        assert err < 1e-5 and moved > 100 * err, (err, moved)
        print("export: model %.2f s, EMA %.2f s; from_pretrained loads both; weights equal the "
              "trained model's full state dict; EMA within %.1e of the recomputed average"
              % (times["model"], times["ema"], err))
        assert d.stop() == 0, d.log()
    print("hf_fsdp2_test: OK")


if __name__ == "__main__":
    main()
