"""Tests of zcc.paddle with PaddlePaddle's CPU wheel (Paddle's own venv).

Trainers are real processes (paddle_worker.py) killed with SIGKILL and run
again: for Momentum, SGD, Adam and AdamW the resumed run equals the
uninterrupted one element for element (parameters, BatchNorm statistics,
accumulators, zccd's EMA, learning rate, generators, `state` and user_state),
restored from zccd's memory and, after a zccd restart, from disk. Two
data-parallel ranks (gloo) write each replicated tensor once and resume
together from zccd's memory; a job grown from one rank to two gives the new
rank rank 0's user_state. In this process: a changed model is refused
naming the tensor before anything is written; multi-precision master weights are registered and restored; a
parameter moved after construction is refused; an accumulator the optimizer
replaced is copied back.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile

import numpy as np
import paddle

import zcc
from zcc.paddle import Checkpointer
from zcc_testing import raises, run_tests
from zccd_process import Zccd

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 8


def _command(d, job, optimizer, out, kill_after, save_every, rank=0, world=1):
    cmd = [sys.executable, "-u", os.path.join(HERE, "paddle_worker.py"), "--socket", d.socket,
           "--root", d.root, "--job", job, "--optimizer", optimizer, "--steps", str(STEPS),
           "--save-every", str(save_every), "--kill-after", str(kill_after),
           "--rank", str(rank), "--world", str(world)]
    return cmd + (["--out", out] if out else [])


def worker(d, job, optimizer, out=None, kill_after=0, save_every=2):
    """Runs paddle_worker.py; returns (exit code, its output)."""
    p = subprocess.run(_command(d, job, optimizer, out, kill_after, save_every),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300,
                       env=dict(os.environ, GLOG_minloglevel="2"))
    return p.returncode, p.stdout.decode(errors="replace")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(commands):
    """Runs one process per rank (commands[r] for rank r) at once, in the
    environment paddle.distributed.launch gives its workers (gloo on the
    CPU); [(exit code, output)] by rank."""
    world = len(commands)
    master = "127.0.0.1:%d" % _free_port()
    endpoints = ["127.0.0.1:%d" % _free_port() for _ in range(world)]
    procs = []
    for r in range(world):
        env = dict(os.environ, GLOG_minloglevel="2", PADDLE_MASTER=master,
                   PADDLE_TRAINER_ID=str(r), PADDLE_TRAINERS_NUM=str(world),
                   PADDLE_GLOBAL_RANK=str(r), PADDLE_GLOBAL_SIZE=str(world),
                   PADDLE_LOCAL_RANK=str(r), PADDLE_LOCAL_SIZE=str(world),
                   PADDLE_RANK_IN_NODE=str(r), PADDLE_NNODES="1",
                   PADDLE_CURRENT_ENDPOINT=endpoints[r],
                   PADDLE_TRAINER_ENDPOINTS=",".join(endpoints),
                   PADDLE_DISTRI_BACKEND="gloo")
        procs.append(subprocess.Popen(commands[r], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, env=env))
    return [(p.wait(300), p.stdout.read().decode(errors="replace")) for p in procs]


def launched(command, world):
    """Runs `command` (a script and its arguments) on `world` ranks under
    `python -m paddle.distributed.launch` (gloo on the CPU), as users start
    Paddle jobs; [(exit code, the rank's log)] by rank (the launcher's exit
    code for each: it stops every rank when one fails)."""
    log_dir = tempfile.mkdtemp(prefix="zcclaunch.")
    try:
        p = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node",
                            str(world), "--master", "127.0.0.1:%d" % _free_port(), "--log_dir",
                            log_dir] + command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=300, env=dict(os.environ, GLOG_minloglevel="2"))
        logs = []
        for r in range(world):
            path = os.path.join(log_dir, "workerlog.%d" % r)
            logs.append(open(path, errors="replace").read() if os.path.exists(path) else "")
        launcher = p.stdout.decode(errors="replace")
        return [(p.returncode, log + ("\n[launcher]\n" + launcher[-3000:] if p.returncode else ""))
                for log in logs]
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def ranks(d, job, world, outs=None, kill_after=0):
    """Runs `world` ranks of paddle_worker.py (AdamW) together."""
    return launch([_command(d, job, "adamw", outs[r] if outs else None, kill_after, 2, r, world)
                   for r in range(world)])


def losses(output):
    return {int(line.split()[1]): line.split()[2] for line in output.splitlines()
            if line.startswith("loss ")}


def restored_line(output):
    """"restored=<step> from=<where>" of a worker's output."""
    line = next(line for line in output.splitlines() if line.startswith("restored="))
    return " ".join(line.split()[:2])


def restored_fields(output):
    line = next(line for line in output.splitlines() if line.startswith("restored="))
    return dict(f.split("=", 1) for f in line.split())


def same_state(ref, got, what, context=""):
    """The number of arrays of `ref` and `got` (.npz), which must be equal;
    `context` (the runs' output) goes with a difference found."""
    a, b = np.load(ref), np.load(got)
    assert sorted(a.files) == sorted(b.files), (what, sorted(a.files), sorted(b.files))
    for name in a.files:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), \
            "%s: %s differs after the resume (%s)\n%s" % (
                what, name, "largest difference %g" % np.max(np.abs(a[name] - b[name]))
                if a[name].shape == b[name].shape else "shapes differ", context)
    return len(a.files)


def runs_told(d, job, **outputs):
    """The workers' outputs and zccd's log lines of `job`, for a failure
    message."""
    told = ["== %s\n%s" % (name, out[-4000:]) for name, out in outputs.items()]
    lines = [line for line in d.log().splitlines() if job in line or "WARNING" in line]
    return "\n".join(told + ["== zccd (job %s, and warnings)" % job] + lines[-80:])


def test_killed_trainers_resume_exactly_from_memory():
    with tempfile.TemporaryDirectory(prefix="zccpd") as tmp, Zccd("pdmem") as d:
        for optimizer in ("momentum", "sgd", "adam", "adamw"):
            ref = os.path.join(tmp, optimizer + "-ref.npz")
            code, ref_out = worker(d, "ref-" + optimizer, optimizer, out=ref)
            assert code == 0, ref_out
            job = "kill-" + optimizer
            code, killed = worker(d, job, optimizer, kill_after=5)
            assert code == -9, (code, killed)
            got = os.path.join(tmp, optimizer + "-resumed.npz")
            code, out = worker(d, job, optimizer, out=got)
            assert code == 0, out
            told = runs_told(d, job, uninterrupted=ref_out, killed=killed, resumed=out)
            assert restored_line(out) == "restored=5 from=memory", told
            # With the EMA of step 5, the dead trainer's own.
            assert restored_fields(out)["ema_step"] == "5", told
            want = {s: v for s, v in losses(ref_out).items() if s > 5}
            assert losses(out) == want, (optimizer, losses(out), want)
            n = same_state(ref, got, optimizer, told)
            if optimizer != "sgd":
                assert any(".velocity" in k or ".moment1" in k for k in np.load(got).files)
            print("  %s: resumed at 5 from memory, %d arrays bit-exact" % (optimizer, n))


def test_resume_from_disk_after_a_zccd_restart():
    with tempfile.TemporaryDirectory(prefix="zccpd") as tmp, Zccd("pddisk") as d:
        ref = os.path.join(tmp, "ref.npz")
        code, ref_out = worker(d, "ref", "adamw", out=ref)
        assert code == 0, ref_out
        code, out = worker(d, "disk", "adamw", kill_after=5)
        assert code == -9, out
        d.wait_latest("disk", 4)
        d.stop()
        d.start()  # a fresh zccd: nothing in memory
        got = os.path.join(tmp, "got.npz")
        code, out = worker(d, "disk", "adamw", out=got)
        assert code == 0, out
        assert restored_line(out) == "restored=4 from=disk", out
        assert losses(out) == {s: v for s, v in losses(ref_out).items() if s > 4}
        same_state(ref, got, "adamw from disk")


def test_data_parallel_replicas_are_written_once_and_resume_exactly():
    with tempfile.TemporaryDirectory(prefix="zccpd") as tmp, Zccd("pddp") as d:
        ref = [os.path.join(tmp, "ref%d.npz" % r) for r in range(2)]
        assert all(code == 0 for code, _ in ranks(d, "dpref", 2, ref))
        for code, out in ranks(d, "dp", 2, kill_after=5):
            assert code == -9, out
        got = [os.path.join(tmp, "got%d.npz" % r) for r in range(2)]
        runs = ranks(d, "dp", 2, got)
        for r, (code, out) in enumerate(runs):
            assert code == 0, out
            # Agreed over the process group: step 5 from zccd's memory, each
            # rank reading the pieces it writes and receiving the others.
            assert restored_line(out) == "restored=5 from=memory", out
            same_state(ref[r], got[r], "rank %d" % r)
        # Each replicated tensor once in the step; each rank's state once.
        step = os.path.join(d.root, "dpref", "step-00000008")
        from safetensors import safe_open
        names = []
        for f in sorted(os.listdir(step)):
            # model-/optim-*.safetensors, and extra-*.bin (safetensors of U8
            # blobs); the EMA has shards of its own.
            if f.endswith((".safetensors", ".bin")) and not f.startswith("ema-"):
                with safe_open(os.path.join(step, f), "np") as st:
                    names += list(st.keys())
        assert len(names) == len(set(names)), sorted(names)
        assert "0.weight" in names and "optimizer.state.0.weight.moment1" in names, names
        assert {"zcc.r00000.rank_state", "zcc.r00001.rank_state", "zcc.trainer_state"} <= \
            set(names), names
        print("  2 ranks: %d tensors in step 8, each once; resumed at 5 bit-exact" % len(names))


def test_a_grown_job_gives_new_ranks_rank_0s_user_state():
    with Zccd("pdgrow") as d:
        code, out = worker(d, "grow", "adamw", kill_after=4)  # one rank; step 4 committed
        assert code == -9, out
        d.wait_latest("grow", 4)
        runs = ranks(d, "grow", 2)
        for r, (code, out) in enumerate(runs):
            assert code == 0, out
            fields = restored_fields(out)
            assert fields["restored"] == "4", out
            # The epoch (user_state) is rank 0's on both; only rank 0 had state of its own.
            assert fields["epoch"] == str(4 // 3), out
            assert fields["own_state"] == ("True" if r == 0 else "False"), out
        assert "rank 1 had no state of its own" in runs[1][1], runs[1][1]


def _mlp(hidden=8, seed=3):
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Linear(4, hidden), paddle.nn.Linear(hidden, 2))


def test_a_changed_model_is_refused_before_anything_is_written():
    with Zccd("pdchg") as d:
        m = _mlp()
        opt = paddle.optimizer.Adam(parameters=m.parameters())
        with Checkpointer(m, opt, job_id="chg", socket=d.socket, root=d.root, save_every=1) as ck:
            ck.step(1)
            ck.flush()
        d.wait_latest("chg", 1)
        other = _mlp(hidden=5, seed=4)
        before = {k: v.numpy().copy() for k, v in other.state_dict().items()}
        opt = paddle.optimizer.Adam(parameters=other.parameters())
        with Checkpointer(other, opt, job_id="chg", socket=d.socket, root=d.root) as ck:
            e = raises(zcc.FailedPreconditionError, ck.restore)
            assert "0.weight" in str(e) or "0.bias" in str(e), str(e)
        for k, v in other.state_dict().items():
            assert np.array_equal(v.numpy(), before[k]), k


def test_multi_precision_master_weights_are_registered_and_restored():
    class Half(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.w = self.create_parameter([4, 3], dtype="float16")

    with Zccd("pdmp") as d:
        m = Half()
        opt = paddle.optimizer.AdamW(parameters=m.parameters(), multi_precision=True)
        with Checkpointer(m, opt, job_id="mp", socket=d.socket, root=d.root, save_every=1) as ck:
            names = {name: t for _, _, t, name in ck._accumulators}
            master = names["optimizer.master_weight.w"]
            assert master.dtype == paddle.float32
            want = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
            paddle.assign(paddle.to_tensor(want), output=master)
            paddle.assign(paddle.full([4, 3], 0.25), output=names["optimizer.state.w.moment1"])
            ck.step(1)
            ck.flush()
        d.wait_latest("mp", 1)
        m2 = Half()
        opt2 = paddle.optimizer.AdamW(parameters=m2.parameters(), multi_precision=True)
        with Checkpointer(m2, opt2, job_id="mp", socket=d.socket, root=d.root) as ck:
            assert ck.restore() == 1
            names = {name: t for _, _, t, name in ck._accumulators}
            assert np.array_equal(names["optimizer.master_weight.w"].numpy(), want)
            assert np.all(names["optimizer.state.w.moment1"].numpy() == 0.25)
            # The optimizer's own dicts hold the restored tensors.
            assert opt2._master_weights[m2.w.name] is names["optimizer.master_weight.w"]


def test_a_moved_parameter_is_refused_and_a_replaced_accumulator_followed():
    with Zccd("pdmv") as d:
        m = _mlp()
        opt = paddle.optimizer.Momentum(parameters=m.parameters(), momentum=0.9)
        with Checkpointer(m, opt, job_id="mv", socket=d.socket, root=d.root, save_every=1) as ck:
            key, ours = next((n, t) for _, _, t, n in ck._accumulators)
            by_param, pname = next((bp, pn) for bp, pn, _, n in ck._accumulators if n == key)
            replacement = paddle.full(ours.shape, 2.0)
            by_param[pname] = replacement  # as an optimizer that allocates anew would
            ck.step(1)
            assert by_param[pname] is ours and np.all(ours.numpy() == 2.0)
            m.to(dtype="float64")
            raises(zcc.FailedPreconditionError, ck.step, 2, match="moved to other memory")


def test_state_that_outgrows_its_blob_grows_it_and_keeps_the_ema():
    """As zcc.torch's: a user_state that outgrows its blob gets a larger one
    (zccd replaces the registration in place, the EMA carried over), and a
    Checkpointer started afresh with small blobs restores the grown step."""
    import warnings
    with Zccd("pdgrow", extra_flags=["--retain_snapshots_s=60"]) as d:
        m = _mlp()
        opt = paddle.optimizer.AdamW(parameters=m.parameters(), learning_rate=0.01)
        user = {"hist": []}
        with Checkpointer(m, opt, job_id="grow", socket=d.socket, root=d.root, save_every=4,
                          ema_decay=0.9, user_state=user, extra_bytes=4096,
                          backpressure="block") as ck:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for step in range(1, 9):
                    m(paddle.ones([2, 4])).sum().backward()
                    opt.step()
                    opt.clear_grad()
                    user["hist"].append("x" * 3000 * step)
                    ck.step(step)
            assert sum("grew to" in str(w.message) for w in caught) >= 2
            ck.flush()
            d.wait_latest("grow", 8)
            ema = {k: v.numpy().copy() for k, v in ck.ema_state_dict(include_buffers=False).items()}
            want = {k: v.numpy().copy() for k, v in m.state_dict().items()}
        other = _mlp(seed=4)
        opt = paddle.optimizer.AdamW(parameters=other.parameters(), learning_rate=0.01)
        restored = {"hist": []}
        with Checkpointer(other, opt, job_id="grow", socket=d.socket, root=d.root, ema_decay=0.9,
                          user_state=restored, extra_bytes=4096) as ck:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert ck.restore() == 8
            assert restored == user
            for k, v in other.state_dict().items():
                assert np.array_equal(v.numpy(), want[k]), k
            got = ck.ema_state_dict(include_buffers=False)
            for k in ema:
                assert np.array_equal(got[k].numpy(), ema[k]), k


if __name__ == "__main__":
    run_tests(globals())
