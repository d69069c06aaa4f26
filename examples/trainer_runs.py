"""Running an example trainer as the resume tests do: to the end, or until it
pauses after a step and is SIGKILLed there; and the resume check that the
integration tests share (a run without zcc, then SIGKILL and resume from
zccd's memory and, after a zccd restart, from disk, every later loss equal).

The trainers print "step=N loss=<float.hex()>" per step, "paused" (or a line
starting with it) when paused, and "restored=... from=..." and similar
fields, which parse() collects.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile

_FIELDS = ("restored", "from", "ema_step", "ema_tensors", "samples_seen")


def parse(output):
    """({step: loss}, {field: value}) of a trainer's output."""
    losses, values = {}, {}
    for line in output.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "step" in fields and "loss" in fields:
            losses[int(fields["step"])] = fields["loss"]
        for k in _FIELDS:
            if k in fields:
                values[k] = fields[k]
    return losses, values


def run(script, args, expect_rc=0, timeout=300):
    """Runs `script` to its end: (losses, values, output)."""
    p = subprocess.run([sys.executable, "-u", script] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if p.returncode != expect_rc:
        raise AssertionError("%s %s exited %d:\n%s" % (script, " ".join(args), p.returncode,
                                                       p.stdout))
    return parse(p.stdout) + (p.stdout,)


def run_and_kill(script, args, timeout=120):
    """Starts a trainer that pauses after a step, SIGKILLs it there (no
    cleanup, no unregister) and reaps it: (losses, output)."""
    p = subprocess.Popen([sys.executable, "-u", script] + args, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    out = []
    try:
        for line in p.stdout:
            out.append(line)
            if line.startswith("paused"):
                break
        else:
            raise AssertionError("trainer exited before pausing:\n" + "".join(out))
    finally:
        p.kill()
        p.wait(timeout)
    assert p.returncode == -9, p.returncode
    return parse("".join(out))[0], "".join(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_env(world):
    """Each rank's environment as torchrun sets it (RANK, WORLD_SIZE,
    MASTER_ADDR/PORT)."""
    port = str(free_port())
    return [dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=port) for rank in range(world)]


def _paddle_env(world):
    """Each rank's environment as paddle.distributed.launch sets it (gloo on
    the CPU)."""
    master = "127.0.0.1:%d" % free_port()
    endpoints = ["127.0.0.1:%d" % free_port() for _ in range(world)]
    return [dict(os.environ, GLOG_minloglevel="2", PADDLE_MASTER=master,
                 PADDLE_TRAINER_ID=str(r), PADDLE_TRAINERS_NUM=str(world),
                 PADDLE_GLOBAL_RANK=str(r), PADDLE_GLOBAL_SIZE=str(world),
                 PADDLE_LOCAL_RANK=str(r), PADDLE_LOCAL_SIZE=str(world),
                 PADDLE_RANK_IN_NODE=str(r), PADDLE_NNODES="1",
                 PADDLE_CURRENT_ENDPOINT=endpoints[r],
                 PADDLE_TRAINER_ENDPOINTS=",".join(endpoints), PADDLE_DISTRI_BACKEND="gloo")
            for r in range(world)]


def start_ranks(script, args, world, launcher="torchrun"):
    """`world` processes of `script`, ranks of one job in the environment
    `launcher` ("torchrun" or "paddle") gives its workers."""
    envs = (_paddle_env if launcher == "paddle" else _torchrun_env)(world)
    procs = []
    for env in envs:
        procs.append(subprocess.Popen([sys.executable, "-u", script] + args, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


def run_ranks(script, args, world, timeout=300, launcher="torchrun"):
    """Runs the ranks to their end: [(losses, values)] by rank."""
    procs = start_ranks(script, args, world, launcher)
    results = []
    for rank, p in enumerate(procs):
        out, _ = p.communicate(timeout=timeout)
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise AssertionError("rank %d of %s failed (%d):\n%s" % (rank, args, p.returncode, out))
        results.append(parse(out))
    return results


def run_launched(script, args, world, timeout=300):
    """Runs `world` ranks of `script` under `python -m
    paddle.distributed.launch` (gloo on the CPU) to their end: [(losses,
    values)] by rank, from each rank's log (workerlog.<rank>)."""
    log_dir = tempfile.mkdtemp(prefix="zcclaunch.")
    try:
        p = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node",
                            str(world), "--master", "127.0.0.1:%d" % free_port(), "--log_dir",
                            log_dir, script] + args, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
        logs = []
        for rank in range(world):
            path = os.path.join(log_dir, "workerlog.%d" % rank)
            logs.append(open(path).read() if os.path.exists(path) else "")
        if p.returncode != 0:
            raise AssertionError("paddle.distributed.launch of %s %s exited %d:\n%s\n%s" % (
                script, " ".join(args), p.returncode, p.stdout[-4000:],
                "\n".join(log[-4000:] for log in logs)))
        return [parse(log) for log in logs]
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def run_ranks_and_kill(script, args, world, timeout=120, launcher="torchrun"):
    """Starts the ranks, SIGKILLs them all once every one has paused:
    [losses] by rank."""
    procs = start_ranks(script, args, world, launcher)
    losses = []
    try:
        for rank, p in enumerate(procs):
            out = []
            for line in p.stdout:
                out.append(line)
                if line.startswith("paused"):
                    break
            else:
                raise AssertionError("rank %d exited before pausing:\n%s" % (rank, "".join(out)))
            losses.append(parse("".join(out))[0])
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout)
    return losses


def check_kill_and_resume(script, zccd, steps=30, pause_after=17, save_every=10):
    """The integration tests' check, on `script` (which takes --socket,
    --root, --steps, --save-every, --no-zcc, --job and --pause-after) and a
    running `zccd`: the losses of a run without zcc; then, for a trainer
    SIGKILLed while paused after `pause_after`, restarted once with zccd
    still up (restores `pause_after` from its memory) and once after a zccd
    restart (restores the last save_every step from disk): every loss
    before the kill and after the resume equals the run without zcc."""
    common = ["--socket", zccd.socket, "--root", zccd.root, "--steps", str(steps),
              "--save-every", str(save_every)]
    baseline, _, log = run(script, common + ["--no-zcc"])
    assert sorted(baseline) == list(range(1, steps + 1)), log
    assert len(set(baseline.values())) > steps // 2, "the losses hardly change: %s" % log
    saved = pause_after // save_every * save_every
    for job, expect, source in (("killed", pause_after, "memory"), ("restarted", saved, "disk")):
        first, log = run_and_kill(script, common + ["--job", job, "--pause-after",
                                                    str(pause_after)])
        assert sorted(first) == list(range(1, pause_after + 1)), log
        bad = [s for s in first if first[s] != baseline[s]]
        assert not bad, "%s: zcc changed the losses at steps %s" % (job, bad)
        zccd.wait_latest(job, saved)
        if job == "restarted":
            assert zccd.stop() == 0, zccd.log()
            zccd.start()
        second, vals, log = run(script, common + ["--job", job])
        assert vals["restored"] == str(expect), (vals, log, zccd.log())
        assert vals["from"] == source, (vals, log)
        assert sorted(second) == list(range(expect + 1, steps + 1)), log
        bad = [s for s in second if second[s] != baseline[s]]
        assert not bad, "%s: losses after resuming differ at steps %s\n%s" % (job, bad, log)
        print("%s: SIGKILL after step %d, restored step %d from %s, losses %d..%d "
              "bit-identical to the run without zcc"
              % (job, pause_after, expect, source, expect + 1, steps))


def check_folder_resume(script, common, tmp, folder_files, dump_ext, steps=30):
    """The Trainer callbacks' check (zcc.hf, zcc.paddleformers) on `script`
    (a Trainer example taking --out, --dump, --no-zcc and --pause-after,
    saving every 10 steps): a run without zcc; a run with it SIGKILLed while
    paused after step 17, which leaves checkpoint-10 holding `folder_files`
    and losses equal to the first run's; the same command again, which
    resumes from checkpoint-10 with every later loss equal and leaves the
    folders of steps 20 and 30. Returns (baseline losses, output dir, the
    final weights' dump of the run without zcc and of the resumed one; files
    ending in `dump_ext`, the caller compares them)."""
    base_dump = os.path.join(tmp, "base" + dump_ext)
    baseline, _, log = run(script, common + ["--no-zcc", "--out", os.path.join(tmp, "base"),
                                             "--dump", base_dump])
    assert sorted(baseline) == list(range(1, steps + 1)), log
    out = os.path.join(tmp, "out")
    first, log = run_and_kill(script, common + ["--out", out, "--pause-after", "17"])
    assert "steps not committed: []" in log, log
    assert sorted(first) == list(range(1, 18)), log
    bad = [s for s in first if first[s] != baseline[s]]
    assert not bad, "zcc changed the losses at steps %s" % bad
    assert sorted(os.listdir(out)) == ["checkpoint-10"], os.listdir(out)
    folder = os.path.join(out, "checkpoint-10")
    assert set(folder_files) <= set(os.listdir(folder)), os.listdir(folder)
    zcc_dump = os.path.join(tmp, "zcc" + dump_ext)
    second, _, log = run(script, common + ["--out", out, "--dump", zcc_dump])
    assert "resume=True" in log, log
    assert sorted(second) == list(range(11, steps + 1)), log
    bad = [s for s in second if second[s] != baseline[s]]
    assert not bad, "losses after resuming differ at steps %s\n%s" % (bad, log)
    # The finished run left the folders of its last committed steps.
    assert sorted(os.listdir(out)) == ["checkpoint-20", "checkpoint-30"], os.listdir(out)
    return baseline, out, base_dump, zcc_dump


def check_ranks_folder_resume(script, common, tmp, job, launcher, resume_launched=False,
                              steps=30):
    """check_folder_resume's kill and resume on two ranks of job `job` (each
    rank's losses compared with a run of two ranks without zcc), started as
    `launcher` starts them; with `resume_launched`, the resume under `python
    -m paddle.distributed.launch` itself. The folder must hold both ranks'
    generators."""
    out = os.path.join(tmp, job)
    two = common + ["--job", job, "--out", out]
    base = run_ranks(script, common + ["--no-zcc", "--out", os.path.join(tmp, job + "-base")],
                     2, launcher=launcher)
    first = run_ranks_and_kill(script, two + ["--pause-after", "17"], 2, launcher=launcher)
    for rank in range(2):
        bad = [s for s in first[rank] if first[rank][s] != base[rank][0][s]]
        assert not bad, "rank %d: zcc changed the losses at steps %s" % (rank, bad)
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(
        os.listdir(os.path.join(out, "checkpoint-10"))), os.listdir(out)
    second = run_launched(script, two, 2) if resume_launched else \
        run_ranks(script, two, 2, launcher=launcher)
    for rank in range(2):
        losses = second[rank][0]
        assert sorted(losses) == list(range(11, steps + 1)), (rank, sorted(losses))
        bad = [s for s in losses if losses[s] != base[rank][0][s]]
        assert not bad, "rank %d: losses after resuming differ at steps %s" % (rank, bad)
