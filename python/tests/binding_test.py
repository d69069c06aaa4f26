"""Tests of the zcc Python binding with PyTorch's tensors and of the zcc.torch
helper (client_test.py has the binding's tests that need no PyTorch).

Plain Python: every test_* function runs in order; the run fails at the first
failing test (after printing which). Tests that need zccd start their own.
"""

import gc
import os
import pickle
import signal
import threading
import time
import warnings

import numpy as np
import torch

import zcc
import zcc.torch
from zcc._plain_state import Blob
from zcc.torch import Checkpointer
from zcc_testing import NO_DAEMON, FakeArray, raises, run_tests
from zccd_process import Zccd


# ------------------------------------------------------------ tensor protocols

def test_describe_torch_through_dlpack():
    for dtype, name in [(torch.float32, "F32"), (torch.bfloat16, "BF16"), (torch.float16, "F16"),
                        (torch.int64, "I64"), (torch.uint8, "U8")]:
        t = torch.zeros(5, 2, dtype=dtype)
        d = zcc.describe_tensor(t)
        assert d["dtype"] == name and d["shape"] == (5, 2), d
        assert d["data"] == t.data_ptr() and d["protocol"] == "__dlpack__", d
    scalar = zcc.describe_tensor(torch.tensor(1.5))
    assert scalar["shape"] == () and scalar["nbytes"] == 4, scalar
    # A view with an offset into its storage.
    base = torch.zeros(10)
    assert zcc.describe_tensor(base[3:])["data"] == base[3:].data_ptr()


def test_non_contiguous_is_value_error():
    e = raises(ValueError, zcc.describe_tensor, np.zeros((4, 4), np.float32)[:, ::2],
               match="not C-contiguous")
    assert isinstance(e, zcc.InvalidArgumentError) and e.code == "INVALID_ARGUMENT"
    raises(ValueError, zcc.describe_tensor, torch.zeros(3, 4).t(), match="not C-contiguous")
    raises(ValueError, zcc.describe_tensor, np.zeros((4, 4), np.float32).T, match="not C-contiguous")
    # Size-1 dimensions may have any stride; empty tensors are fine.
    zcc.describe_tensor(torch.zeros(4, 1).t())
    zcc.describe_tensor(np.zeros((0, 3), np.float32))


def test_unsupported_dtypes_are_value_errors():
    for a in [np.zeros(3, np.complex64), np.zeros(3, np.uint16), np.zeros(3, np.uint64),
              np.zeros(3, np.dtype(">f4")), np.array(["a"]), np.zeros(2, object)]:
        raises(ValueError, zcc.describe_tensor, a)
    raises(ValueError, zcc.describe_tensor, torch.zeros(3, dtype=torch.complex64))
    raises(ValueError, zcc.describe_tensor, torch.zeros(3, dtype=torch.int16).numpy().astype(np.uint32))


def test_other_bad_inputs():
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    raises(ValueError, zcc.describe_tensor, ro, match="read-only")
    raises(ValueError, zcc.describe_tensor, [1.0, 2.0], match="exposes no")
    raises(ValueError, zcc.describe_tensor, torch.zeros(3, requires_grad=True), match="detach")
    raises(ValueError, zcc.describe_tensor, FakeArray({"shape": (2,)}), match="needs")
    raises(ValueError, zcc.describe_tensor, FakeArray("nope"), match="not a dict")
    raises(ValueError, zcc.describe_tensor,
           FakeArray({"shape": (2,), "typestr": "<f4", "data": (1, False), "mask": object()}),
           match="masked")


# -------------------------------------------------------------- registration

def test_checkpointer_without_daemon():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = time.monotonic()
    with Checkpointer(model, opt, job_id="absent", socket=NO_DAEMON, connect_timeout=0.3) as ck:
        loss = model(torch.randn(3, 4)).sum()
        loss.backward()
        opt.step()
        assert ck.step(1) == "skipped_disconnected"
        raises(zcc.UnavailableError, ck.restore)
    assert time.monotonic() - start < 10


# ------------------------------------------------------------- with a zccd

def test_round_trip_with_daemon():
    with Zccd("bind") as d:
        c = zcc.connect("rt", socket_path=d.socket, checkpoint_root=d.root, save_every=2,
                        ema_decay=0.5, backpressure="block")
        w = np.arange(6, dtype=np.float32).reshape(2, 3)
        m = np.zeros(6, np.float32)
        t = torch.zeros(3, dtype=torch.bfloat16)
        blob = np.zeros(16, np.uint8)
        c.register_tensors([zcc.TensorSpec("w", w, ema_eligible=True),
                            zcc.TensorSpec("m", m, kind="optim"),
                            zcc.TensorSpec("t", t, kind="param"),
                            zcc.TensorSpec("blob", blob, kind="extra")])
        t_ptr = t.data_ptr()
        del t  # the client keeps the tensor's memory alive through DLPack
        gc.collect()
        assert c.stats()["connected"]
        e = raises(zcc.NotFoundError, c.restore)
        assert isinstance(e, LookupError) and "no committed checkpoint" in str(e), e
        for step in (1, 2):
            c.fence()
            w += 1
            m[:] = step
            blob[:] = step
            assert c.snapshot(step) == "enqueued"
        c.flush()
        d.wait_latest("rt", 2)
        # zccd records the commit just after it wrote `latest`: poll.
        deadline = time.monotonic() + 10
        st = c.checkpoint_status()
        while st["last_committed_step"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
            st = c.checkpoint_status()
        assert st["last_committed_step"] == 2, st
        # EMA: into new arrays, into given buffers; bad requests.
        deadline = time.monotonic() + 10
        while c.read_ema()[0] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        step, ema = c.read_ema()
        assert step == 2 and list(ema) == ["w"] and ema["w"].shape == (2, 3), ema
        first = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
        assert np.array_equal(ema["w"], 0.5 * first + 0.5 * (first + 1)), ema["w"]
        out = np.zeros((2, 3), np.float32)
        assert c.read_ema(out={"w": out})[0] == 2 and np.array_equal(out, ema["w"])
        raises(ValueError, c.read_ema, out={"w": np.zeros(5, np.float32)}, match="elements")
        raises(ValueError, c.read_ema, out={"w": np.zeros(6, np.float64)}, match="float32")
        raises(LookupError, c.read_ema, ["nope"])
        raises(LookupError, c.read_ema, ["m"])  # not EMA-eligible
        c.save_now()
        c.close()

        # A new client restores into fresh buffers.
        c = zcc.connect("rt", socket_path=d.socket, checkpoint_root=d.root, save_every=2,
                        ema_decay=0.5)
        w2, m2, blob2 = np.zeros((2, 3), np.float32), np.zeros(6, np.float32), np.zeros(16, np.uint8)
        t2 = torch.ones(3, dtype=torch.bfloat16)
        c.register_tensors([zcc.TensorSpec("w", w2, ema_eligible=True),
                            zcc.TensorSpec("m", m2, kind="optim"),
                            zcc.TensorSpec("t", t2, kind="param"),
                            zcc.TensorSpec("blob", blob2, kind="extra")])
        assert c.restore() == 2
        assert np.array_equal(w2, w) and np.all(m2 == 2) and np.all(blob2 == 2)
        assert torch.equal(t2, torch.zeros(3, dtype=torch.bfloat16))
        assert t_ptr != 0
        assert c.read_ema()[0] == 2  # zccd restored its EMA with the checkpoint
        c.close()

        # A registration that does not match the checkpoint is refused cleanly.
        c = zcc.connect("rt", socket_path=d.socket, checkpoint_root=d.root)
        c.register_tensors([zcc.TensorSpec("other", np.zeros(3, np.float32))])
        e = raises(zcc.Error, c.restore)
        assert e.code in ("FAILED_PRECONDITION", "NOT_FOUND"), e.code
        raises(zcc.FailedPreconditionError, c.read_ema, [])  # registered without ema_decay
        c.close()
        assert d.stop() == 0, d.log()


def test_gil_released_while_waiting():
    """A query to a stopped zccd waits for its RPC deadline without the GIL."""
    with Zccd("gil") as d:
        c = zcc.connect("gil", socket_path=d.socket, checkpoint_root=d.root, rpc_timeout=1.5,
                        daemon_timeout=30.0)
        c.register_tensors([zcc.TensorSpec("w", np.zeros(4, np.float32))])
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            # Stopped once every thread has taken the signal, which on a busy
            # machine is not at once.
            deadline = time.monotonic() + 10
            while open("/proc/%d/stat" % d.proc.pid).read().split(")")[-1].split()[0] != "T":
                assert time.monotonic() < deadline, "zccd did not stop"
                time.sleep(0.001)
            result = {}

            def query():
                try:
                    c.checkpoint_status()
                except zcc.Error as e:
                    result["error"] = e

            th = threading.Thread(target=query)
            th.start()
            ticks = 0
            t0 = time.monotonic()
            while th.is_alive():
                ticks += 1
                if ticks % 1000 == 0:
                    time.sleep(0)
            waited = time.monotonic() - t0
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        assert isinstance(result.get("error"), TimeoutError), result
        assert waited >= 1.0, waited
        assert ticks > 100000, "the main thread barely ran (%d ticks in %.1f s)" % (ticks, waited)
        c.close()


# ------------------------------------------------------------- zcc.torch

def train(model, opt, steps, ckpt=None, sched=None, before_step=None):
    torch.manual_seed(7)
    for step in range(1, steps + 1):
        x = torch.randn(8, 6)
        loss = (model(x) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        if before_step is not None:
            before_step(step)
        if ckpt is not None:
            ckpt.step(step)


def make(opt_factory, seed=3):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    return model, opt_factory(model.parameters())


def unknown_to_zcc(optimizer_class):
    """A subclass: zcc knows the state layout of exact classes only, so it
    materialises this one's state with a probe step."""
    return type("Probed" + optimizer_class.__name__, (optimizer_class,), {})


def test_materialising_optimizer_state_keeps_numerics():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    factories = {
        "sgd_momentum_dampening": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.3,
                                                            weight_decay=0.01),
        "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
        "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True),
        "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
        "adamw_probed": lambda p: unknown_to_zcc(torch.optim.AdamW)(p, lr=0.01, weight_decay=0.1),
        "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
        "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.05),
    }
    for name, factory in factories.items():
        model, opt = make(factory)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        ref_model2, ref_opt2 = make(factory)
        ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt2, step_size=2, gamma=0.5)
        train(ref_model2, ref_opt2, 6, sched=ref_sched)
        with Checkpointer(model, opt, job_id="numerics", socket=NO_DAEMON, scheduler=sched) as ck:
            assert all(len(s) == 0 for s in opt.state.values()) or name == "adagrad", \
                "%s: the probe step left optimizer state behind" % name
            train(model, opt, 6, ckpt=ck, sched=sched)
            for i, p in enumerate(ck._opt_params):
                for key, buf in ck._opt_bufs[i].items():
                    assert opt.state[p][key] is buf, "%s: state %s is not the registered buffer" % (name, key)
        for (n, a), b in zip(model.state_dict().items(), ref_model2.state_dict().values()):
            assert a.numpy().tobytes() == b.numpy().tobytes(), "%s: %s differs" % (name, n)


def test_lr_scheduler_in_either_order():
    """An LR scheduler created before or after the Checkpointer wraps the same
    fenced optimizer.step without warnings (PyTorch 1.x and 2.x mark their
    wrapper differently), and the optimizer still steps after close()."""
    for scheduler_first in (True, False):
        model, opt = make(lambda p: torch.optim.AdamW(p, lr=0.01))
        with warnings.catch_warnings():
            # "optimizer.step() has been overridden after learning rate
            # scheduler initialization", "lr_scheduler.step() before optimizer.step()"
            warnings.simplefilter("error")
            sched = None
            if scheduler_first:
                sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=10)
            with Checkpointer(model, opt, job_id="order", socket=NO_DAEMON, scheduler=sched) as ck:
                if not scheduler_first:
                    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=10)
                    ck.scheduler = sched
                fences = []
                fence = ck.fence
                ck.fence = lambda: (fences.append(1), fence())
                train(model, opt, 3, ckpt=ck, sched=sched)
                # Each optimizer.step fenced once; ckpt.step need not fence
                # again (nothing was enqueued since).
                assert len(fences) == 3, (scheduler_first, len(fences))
                ck.step(4)  # without an optimizer.step since the last snapshot: it fences
                assert len(fences) == 4, (scheduler_first, len(fences))
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()  # after close: no fence, still steps
        assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters())), scheduler_first


def test_fence_survives_a_step_put_back():
    """A loss scaler's path (Accelerate's AcceleratedOptimizer, the Trainer's
    fp16) saves optimizer.step before the Checkpointer exists, patches it
    for each step and puts the saved method back after it: every step still
    fences first (a wrapper of the attribute would be gone after the first),
    and one through the patch too."""
    model, opt = make(lambda p: torch.optim.AdamW(p, lr=0.01))
    saved = opt.step  # (as AcceleratedOptimizer.__init__ keeps it)
    with Checkpointer(model, opt, job_id="putback", socket=NO_DAEMON) as ck:
        fences = []
        fence = ck.fence
        ck.fence = lambda: (fences.append(1), fence())
        opt.step = saved  # (as after Accelerate's first scaled step)

        def scaled_step(step):
            patched = opt.step
            opt.step = lambda *a, **k: saved(*a, **k)  # (GradScaler.step's call)
            opt.step()
            opt.step = patched

        train(model, opt, 3, ckpt=ck, before_step=scaled_step)
        # Each of the 6 steps fenced first; ckpt.step found them fenced.
        assert len(fences) == 6, len(fences)
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()  # after close: no fence (the hook is gone), still steps
    assert len(fences) == 6, len(fences)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_probe_fires_no_step_hooks():
    """The probe step that lays out an unknown optimizer's state is not a
    step: PyTorch 2.x's step hooks (the optimizer's and the global ones) do
    not see it, and its step counter is left as it was."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    model, opt = make(lambda p: unknown_to_zcc(torch.optim.AdamW)(p, lr=0.01))
    calls = []
    handles = [opt.register_step_pre_hook(lambda *a: calls.append("pre")),
               opt.register_step_post_hook(lambda *a: calls.append("post")),
               register_optimizer_step_pre_hook(
                   lambda *a: calls.append("global pre"))]
    count = getattr(opt, "_step_count", None)
    try:
        with Checkpointer(model, opt, job_id="hooks", socket=NO_DAEMON) as ck:
            assert ck._opt_bufs and all(ck._opt_bufs), "the probe found no state"
            assert calls == [], calls
            assert getattr(opt, "_step_count", None) == count
            train(model, opt, 1, ckpt=ck)
            assert sorted(calls) == ["global pre", "post", "pre"], calls
    finally:
        for h in handles:
            h.remove()


def test_tensor_hyperparameters_are_restored_in_place():
    """PyTorch 2.x accepts a tensor lr and tensor betas: they are checkpointed
    as plain data and restored into the optimizer's own tensors."""
    def factory(p):
        return torch.optim.Adam(p, lr=torch.tensor(0.01), foreach=False,
                                betas=(torch.tensor(0.8), torch.tensor(0.95)))
    with Zccd("hyper") as d:
        model, opt = make(factory)
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
        with Checkpointer(model, opt, job_id="hyper", socket=d.socket, root=d.root, save_every=3,
                          scheduler=sched, backpressure="block") as ck:
            assert ck.wait_connected()
            train(model, opt, 3, ckpt=ck, sched=sched)
            ck.flush()
        d.wait_latest("hyper", 3)
        lr_after = opt.param_groups[0]["lr"].clone()
        assert abs(lr_after.item() - 0.01 * 0.5 ** 3) < 1e-9, lr_after  # the scheduler ran

        model2, opt2 = make(factory, seed=9)
        sched2 = torch.optim.lr_scheduler.ExponentialLR(opt2, gamma=0.5)
        group = opt2.param_groups[0]
        lr_tensor, beta1 = group["lr"], group["betas"][0]
        with Checkpointer(model2, opt2, job_id="hyper", socket=d.socket, root=d.root,
                          scheduler=sched2) as ck2:
            assert ck2.restore() == 3
        assert group["lr"] is lr_tensor and torch.equal(lr_tensor, lr_after), group["lr"]
        assert group["betas"][0] is beta1 and beta1.item() == torch.tensor(0.8).item()
        for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
            assert torch.equal(a, b)
        assert d.stop() == 0, d.log()


def test_close_releases_staging_memory_unless_asked_to_keep_it():
    """close() releases the rank's staging memory in zccd at once;
    close(keep_snapshots=True), and leaving a with block by an exception, keep
    the newest snapshots for a restore from memory by the next trainer."""
    with Zccd("close") as d:
        def segments(job):
            return [n for n in os.listdir("/dev/shm") if n.startswith("%s.%s." % (d.shm_prefix, job))]

        def stepped(job):
            model = torch.nn.Linear(64, 64)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            ck = Checkpointer(model, opt, job_id=job, socket=d.socket, root=d.root)
            model(torch.randn(2, 64)).sum().backward()
            opt.step()
            assert ck.step(1) == "enqueued", ck.client.stats()
            ck.flush()
            return ck

        stepped("released").close()
        assert segments("released") == [], segments("released")
        stepped("kept").close(keep_snapshots=True)
        assert segments("kept"), "close(keep_snapshots=True) kept nothing"
        try:
            with stepped("raised"):
                raise RuntimeError("the training loop failed")
        except RuntimeError:
            pass
        assert segments("raised"), "a with block left by an exception kept nothing"
        with stepped("clean"):
            pass
        assert segments("clean") == [], segments("clean")
        assert d.stop() == 0, d.log()


def test_restore_from_memory_says_the_ema_is_ahead():
    """A restore from memory of an older step than the previous trainer
    reached keeps that trainer's EMA (steps replayed are not folded in twice):
    ckpt.ema_step says which step the EMA is at, and a warning says it is
    ahead of the restored step."""
    with Zccd("emaahead") as d:
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ck = Checkpointer(model, opt, job_id="emaahead", socket=d.socket, root=d.root,
                          ema_decay=0.9)
        for step in (1, 2, 3):
            model(torch.randn(2, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
            assert ck.step(step) == "enqueued", ck.client.stats()
        ck.ema_state_dict()  # waits until the EMA has folded in step 3
        assert ck.ema_step == 3, ck.ema_step
        ck.close(keep_snapshots=True)

        model2 = torch.nn.Linear(16, 16)
        opt2 = torch.optim.SGD(model2.parameters(), lr=0.1)
        with Checkpointer(model2, opt2, job_id="emaahead", socket=d.socket, root=d.root,
                          ema_decay=0.9) as ck2:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert ck2.restore(step=2) == 2
            assert ck2.restored_from == "memory", ck2.restored_from
            assert ck2.ema_step == 3, ck2.ema_step
            assert any("folded in steps up to 3" in str(w.message) for w in caught), \
                [str(w.message) for w in caught]
        assert d.stop() == 0, d.log()


def test_a_new_jobs_first_step_right_after_construction_is_taken():
    """A Checkpointer registers with prefetch_restore by default; in a job
    with nothing committed zccd holds no slot for it, so a step() at once
    after construction is enqueued even where the state is large enough for
    zccd to reserve the slots after the first in the background."""
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(3)])  # 150 MB/slot
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 2048)).sum().backward()
    opt.step()  # state exists: step() has no fresh buffers to zero, and comes at once
    with Zccd("newjob") as d:
        with Checkpointer(model, opt, job_id="newjob", socket=d.socket, root=d.root) as ck:
            assert ck.step(1) == "enqueued", ck.client.stats()
            ck.flush()
        assert d.stop() == 0, d.log()


def test_wrapped_models_register_state_dict_keys():
    """DDP's .module and torch.compile's ._orig_mod are unwrapped: the names
    zcc registers are the model's own state-dict keys."""
    model, opt = make(lambda p: torch.optim.SGD(p, lr=0.1))
    keys = list(model.state_dict())
    with Checkpointer(torch.compile(model), opt, job_id="wrapped", socket=NO_DAEMON) as ck:
        names = [s.name for s in ck._specs if s.kind == zcc.TensorKind.PARAM]
    assert names == keys, (names, keys)


def _registered_optimizer_state(ck):
    """Per optimizer parameter: [(key, dtype, shape, device)] of the buffers
    the Checkpointer registered, in registration order."""
    return [[(k, b.dtype, tuple(b.shape), b.device) for k, b in bufs.items()]
            for bufs in ck._opt_bufs]


def test_first_step_layouts_match_the_probe():
    """For the optimizers whose state zcc lays out without a probe step, the
    registered buffers are exactly what the probe step finds (keys, order,
    dtypes, shapes, devices), for the installed PyTorch; the probe runs for a
    subclass, whose state zcc cannot know."""
    def two_groups(cls, **kw):
        return lambda ps: cls([{"params": ps[:2]}, {"params": ps[2:], "amsgrad": True}], **kw)
    configs = {
        "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
        "adam_amsgrad": lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True),
        "adam_foreach": lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01),
        "adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=0.01, amsgrad=True),
        "adamw_amsgrad_in_one_group": two_groups(torch.optim.AdamW, lr=0.01),
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
        "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01),
        "rmsprop_momentum_centered": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5,
                                                                   centered=True),
    }
    torch_2 = int(torch.__version__.split(".")[0]) >= 2
    if torch_2:  # fused CPU kernels
        configs["adamw_fused"] = lambda ps: torch.optim.AdamW(ps, lr=0.01, fused=True)
    # (name, factory, parameter dtype, default dtype: the dtype of `step`)
    cases = [(name, factory, torch.float32, torch.float32) for name, factory in configs.items()]
    cases += [("adamw_bf16", configs["adamw"], torch.bfloat16, torch.float32),
              ("adamw_default_float64", configs["adamw"], torch.float64, torch.float64),
              ("rmsprop_default_float64", configs["rmsprop"], torch.float64, torch.float64)]
    if torch_2:
        cases.append(("adamw_fused_default_float64", configs["adamw_fused"], torch.float64,
                      torch.float64))
    default_dtype = torch.get_default_dtype()
    try:
        for name, factory, dtype, default in cases:
            torch.set_default_dtype(default)
            found = {}
            for path in ("layout", "probe"):
                model, _ = make(lambda p: None)
                model.to(dtype)
                params = list(model.parameters())
                opt = factory(params)
                if path == "probe":
                    opt.__class__ = unknown_to_zcc(type(opt))
                values = [p.detach().clone() for p in params]
                with Checkpointer(model, opt, job_id="layout", socket=NO_DAEMON) as ck:
                    assert (zcc._optim_state.first_step_state_layouts(opt) is None) == (path == "probe"), \
                        (name, path)
                    found[path] = _registered_optimizer_state(ck)
                    assert all(len(s) == 0 for s in opt.state.values()), (name, path)
                    assert all(torch.equal(v, p) for v, p in zip(values, params)), (name, path)
            assert found["layout"] == found["probe"], "%s:\n layout %s\n probe  %s" % (
                name, found["layout"], found["probe"])
            assert any(found["layout"]) or name == "sgd", name
    finally:
        torch.set_default_dtype(default_dtype)


def test_fresh_optimizer_buffers_hold_zeros():
    """The buffers zcc allocates for state the optimizer has not created yet
    are not written at construction (a restore or the optimizer's first step
    overwrites them), but a snapshot never carries whatever the allocator
    reused: step() zeroes those the optimizer's state is still not bound to,
    and leaves the bound ones alone."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))
    model[1].requires_grad_(False)  # no gradient: its state stays unbound
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    with Checkpointer(model, opt, job_id="zeros", socket=NO_DAEMON) as ck:
        bufs = [b for per_param in ck._opt_bufs for b in per_param.values()]
        assert len(bufs) == 3 * 4, len(bufs)  # step, exp_avg, exp_avg_sq per parameter
        for b in bufs:  # what the allocator reused, as if
            b.fill_(7)
        model(torch.randn(4, 512)).sum().backward()
        opt.step()
        ck.step(1)
        bound = [ck._bound[i] for i in range(len(ck._opt_params))]
        assert bound == [True, True, False, False], bound
        for i, per_param in enumerate(ck._opt_bufs):
            for key, b in per_param.items():
                if bound[i]:
                    assert torch.equal(b, opt.state[ck._opt_params[i]][key]), key
                    assert b is opt.state[ck._opt_params[i]][key], key
                else:
                    assert not b.any(), "unbound optimizer buffer %s of param %d is not zero" % (
                        key, i)


def _state_of(model, opt):
    """Parameters and optimizer state, cloned, in order."""
    params = [p.detach().clone() for p in model.parameters()]
    state = [{k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state.get(p, {}).items()}
             for p in model.parameters()]
    return params, state


def _same_state(model, opt, expected, what):
    params, state = expected
    for i, (p, q) in enumerate(zip(model.parameters(), params)):
        assert torch.equal(p, q), "%s: parameter %d differs" % (what, i)
        got = opt.state.get(p, {})
        assert got.keys() == state[i].keys(), (what, i, sorted(got), sorted(state[i]))
        for k, v in state[i].items():
            assert torch.equal(got[k], v) if torch.is_tensor(v) else got[k] == v, (what, i, k)


def test_restore_copies_fresh_optimizer_state_as_zccd_checks_it_and_nothing_of_a_damaged_step_stays():
    """zcc.torch has its fresh optimizer buffers copied as soon as zccd has
    checked them, while the rest is read (early_copy). A step damaged at the
    end of its optimizer file, after the other tensors were copied, falls back
    to the step before bit for bit; with nowhere to fall back, restore()
    raises, the parameters are untouched, and training on gives what a
    Checkpointer that never restored gives."""
    def one_step(model, opt, seed):
        torch.manual_seed(seed)
        loss = (model(torch.randn(8, 6)) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    adamw = lambda p: torch.optim.AdamW(p, lr=0.01)
    with Zccd("early", extra_flags=["--retain_snapshots_s=0"]) as d:
        model, opt = make(adamw)
        with Checkpointer(model, opt, job_id="early", socket=d.socket, root=d.root,
                          save_every=1) as ck:
            one_step(model, opt, 1)
            ck.step(1)
            at_step1 = _state_of(model, opt)
            one_step(model, opt, 2)
            ck.step(2)
            ck.flush()
            d.wait_latest("early", 2)
        optim_file = os.path.join(d.root, "early", "step-00000002", "optim-r00000.safetensors")
        with open(optim_file, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 0x5A]))

        model2, opt2 = make(adamw, seed=4)
        with Checkpointer(model2, opt2, job_id="early", socket=d.socket, root=d.root) as ck2:
            assert any(ck2._early_copy) and not all(ck2._early_copy), ck2._early_copy
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert ck2.restore() == 1
            _same_state(model2, opt2, at_step1, "fallback to step 1")

        # A step zccd already found damaged is refused by name, not taken for
        # "nothing to restore".
        model3, opt3 = make(adamw, seed=5)
        with Checkpointer(model3, opt3, job_id="early", socket=d.socket, root=d.root) as ck3:
            raises(zcc.NotFoundError, ck3.restore, step=2, match="damaged")
        # A new zccd finds the damage while it reads, after the optimizer
        # file's other tensors were checked and copied.
        d.stop()
        d.start()
        before = _state_of(model3, opt3)
        with Checkpointer(model3, opt3, job_id="early", socket=d.socket, root=d.root) as ck3:
            raises(zcc.DataLossError, ck3.restore, step=2, match="checksum mismatch")
            _same_state(model3, opt3, before, "after the failed restore")
            one_step(model3, opt3, 3)
            ck3.step(1)
        model4, opt4 = make(adamw, seed=5)
        one_step(model4, opt4, 3)
        _same_state(model3, opt3, _state_of(model4, opt4), "training on after the failed restore")


def test_existing_optimizer_state_is_registered_as_is():
    """A Checkpointer created after training started registers the
    optimizer's own state tensors: no probe, no copies."""
    model, opt = make(lambda p: torch.optim.AdamW(p, lr=0.01))
    train(model, opt, 2)
    values = [p.detach().clone() for p in model.parameters()]
    with Checkpointer(model, opt, job_id="existing", socket=NO_DAEMON) as ck:
        for i, p in enumerate(ck._opt_params):
            assert ck._bound[i]
            assert ck._opt_bufs[i].keys() == {k for k, v in opt.state[p].items() if torch.is_tensor(v)}
            for key, buf in ck._opt_bufs[i].items():
                assert opt.state[p][key] is buf, key
    assert all(torch.equal(v, p) for v, p in zip(values, model.parameters()))


def test_random_states_come_back_exactly():
    """The Python, NumPy and torch RNG states a snapshot took are the ones a
    restore puts back: the draws after the restore repeat the draws after the
    snapshot. (Python's state travels as packed words; a checkpoint written
    with the plain tuple of ints still loads.)"""
    import random
    with Zccd("rng") as d:
        model, opt = make(lambda p: torch.optim.SGD(p, lr=0.1))
        with Checkpointer(model, opt, job_id="rng", socket=d.socket, root=d.root,
                          save_every=1, backpressure="block") as ck:
            random.seed(11)
            np.random.seed(12)
            torch.manual_seed(13)
            for _ in range(3):  # move every generator along from its seed
                random.random(), np.random.rand(), torch.rand(1)
            assert ck.step(1) == "enqueued"
            want = (random.random(), np.random.rand(), torch.rand(1).item())
            ck.flush()
            d.wait_latest("rng", 1)
        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)
        model, opt = make(lambda p: torch.optim.SGD(p, lr=0.1))
        with Checkpointer(model, opt, job_id="rng", socket=d.socket, root=d.root) as ck:
            assert ck.restore() == 1
            assert (random.random(), np.random.rand(), torch.rand(1).item()) == want
    version, words, gauss = random.getstate()
    old_format = (version, words, gauss)  # what earlier checkpoints hold
    zcc._rng_state.set_python_rng_state(old_format)
    assert random.getstate() == old_format
    zcc._rng_state.set_python_rng_state(zcc._rng_state.python_rng_state())
    assert random.getstate() == old_format


def test_torch_generator_read_only_when_it_moved():
    """zcc.torch reads torch's CPU generator again only when it moved;
    whatever moved it (draws of every kind, a normal cached or used, seeds,
    set_rng_state back to a state with a cached normal), the copy equals
    torch.get_rng_state()."""
    from zcc import _torch_rng
    reads = [0]
    public = torch.get_rng_state

    def counted():
        reads[0] += 1
        return public()

    torch.get_rng_state = counted
    try:
        state = _torch_rng.CpuGeneratorState()
        out = torch.zeros_like(public())

        def same(moved):
            before = reads[0]
            state.copy_into(out)
            assert torch.equal(out, public()), "the copy differs from torch's state"
            assert (reads[0] > before) == moved, (moved, reads[0] - before)

        torch.manual_seed(21)
        same(True)
        assert state._watch is not None  # the fast path is in use on this torch
        same(False)
        draws = (lambda: torch.rand(3), lambda: torch.randint(0, 9, (700,)),
                 lambda: torch.randn(1), lambda: torch.randn(1, dtype=torch.float64),
                 lambda: torch.empty(5, dtype=torch.float64).normal_(),
                 lambda: torch.randperm(2000), lambda: torch.bernoulli(torch.full((9,), 0.5)),
                 lambda: torch.manual_seed(22), lambda: torch.seed(), lambda: torch.rand(5000))
        for draw in draws:
            draw()
            same(True)
            same(False)
        torch.Generator().manual_seed(5).seed()  # another generator: nothing to read
        same(False)
        # A state whose cached normal is set, put back after it was used.
        torch.manual_seed(23)
        torch.randn(1)  # a pair drawn, one cached
        with_normal = public()
        torch.randn(1, dtype=torch.float64)  # uses the cached one
        same(True)
        torch.set_rng_state(with_normal)
        same(True)
        assert torch.equal(out, with_normal)
        # Written by something else (a restore): read again once told, and
        # only then (the generator itself did not move).
        out.zero_()
        before = reads[0]
        state.copy_into(out)
        assert reads[0] == before and not torch.any(out)
        state.forget()
        same(True)
        same(False)
        # Where the generator's memory cannot be read (another layout):
        # found nowhere, a few tries, then the public state at every call.
        unreadable = _torch_rng.CpuGeneratorState()
        saved_read, _torch_rng._read_memory = _torch_rng._read_memory, lambda *a: None
        try:
            for _ in range(6):
                before = reads[0]
                unreadable.copy_into(out)
                assert torch.equal(out, public())
                assert reads[0] - before in (1, 2)  # (2 while it still searches)
            assert unreadable._watch is None and unreadable._searches_left == 0
        finally:
            _torch_rng._read_memory = saved_read
    finally:
        torch.get_rng_state = public


class Replacing(torch.optim.Optimizer):
    """An optimizer that puts a new state tensor in place at every step (as
    some third-party ones do), instead of updating it."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if "acc" not in state:
                    state["acc"] = torch.zeros_like(p)
                state["acc"] = state["acc"] + p.grad  # a new tensor
                p.sub_(group["lr"] * state["acc"])


def test_state_tensors_replaced_every_step_are_followed():
    """Each step() finds the optimizer's new state tensors, copies them into
    the registered buffers and binds those: the checkpoint of a step holds
    that step's state, and a restore gives it back."""
    with Zccd("replacing") as d:
        model, opt = make(Replacing)
        with Checkpointer(model, opt, job_id="rep", socket=d.socket, root=d.root, save_every=1,
                          backpressure="block") as ck:
            train(model, opt, 4, ckpt=ck)
            want = {n: opt.state[p]["acc"].clone() for n, p in model.named_parameters()}
            ck.flush()
            d.wait_latest("rep", 4)
        model, opt = make(Replacing)
        with Checkpointer(model, opt, job_id="rep", socket=d.socket, root=d.root) as ck:
            assert ck.restore() == 4
            for n, p in model.named_parameters():
                assert torch.equal(opt.state[p]["acc"], want[n]), n


def test_user_state_must_be_plain_and_fit():
    model, opt = make(lambda p: torch.optim.SGD(p, lr=0.1))
    user = {"ok": [1, 2.5, "x", None, (True, b"\x00")]}
    with Checkpointer(model, opt, job_id="user", socket=NO_DAEMON, user_state=user,
                      extra_bytes=16 << 10) as ck:
        ck.step(1)
        user["bad"] = object()
        raises(TypeError, ck.step, 2, match="plain data")
        # A flat list takes the fast path until an element is not plain.
        user["bad"] = list(range(1000)) + [object()]
        raises(TypeError, ck.step, 2, match="['user_state']['bad'][1000] is a object")
        del user["bad"]
        # Outgrown: the blob grows (no zccd here: registered when one comes).
        user["big"] = "x" * 20000
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ck.step(3)
        assert ck._blobs["rank"].array.size >= 40000, ck._blobs["rank"].array.size
        assert any("grew to" in str(w.message) for w in caught), [str(w.message) for w in caught]
        assert ck._blobs["rank"].read()["user_state"]["big"] == "x" * 20000


class Counter:
    """A Stateful of this test's own: plain data, a tensor, a NumPy array."""

    def __init__(self):
        self.n, self.t, self.a = 0, torch.zeros(3), np.zeros(2, np.int64)

    def state_dict(self):
        return {"n": self.n, "t": self.t.clone(), "a": self.a.copy(), "np": np.int64(self.n)}

    def load_state_dict(self, sd):
        assert torch.is_tensor(sd["t"]) and isinstance(sd["a"], np.ndarray), sd
        self.n, self.t, self.a = sd["n"], sd["t"], sd["a"]


def test_stateful_objects_resume_exactly():
    """Checkpointer(state={...}): torchdata's StatefulDataLoader resumes at
    the batch after the snapshot, a Stateful of plain data, a tensor and an
    array comes back exactly, and so does a torch.Generator; what cannot be stored is refused at
    construction, a state that outgrows its blob at step() with the size to ask."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    import warnings
    warnings.filterwarnings("ignore", message=".*set_vital.*")

    def loader():
        return StatefulDataLoader(list(range(50)), batch_size=4, shuffle=True,
                                  generator=torch.Generator().manual_seed(5))

    with Zccd("stateful") as d:
        model, opt = make(lambda p: torch.optim.SGD(p, lr=0.1))
        dl, counter = loader(), Counter()
        gen = torch.Generator().manual_seed(9)
        with Checkpointer(model, opt, job_id="sf", socket=d.socket, root=d.root, save_every=1,
                          backpressure="block",
                          state={"data": dl, "counter": counter, "gen": gen}) as ck:
            it = iter(dl)
            for step in range(1, 17):  # over an epoch's end (13 batches)
                batch = next(it, None)
                if batch is None:
                    it = iter(dl)
                    batch = next(it)
                counter.n, counter.t[:] = step, float(step)
                counter.a[:] = [step, -step]
                assert ck.step(step) == "enqueued"
            torch.rand(3, generator=gen)  # moved before the last snapshot
            assert ck.step(17) == "enqueued"
            want = [next(it).tolist() for _ in range(3)]
            want_gen = torch.rand(4, generator=gen)
            ck.flush()
            d.wait_latest("sf", 17)
        model, opt = make(lambda p: torch.optim.SGD(p, lr=0.1))
        dl, counter, gen = loader(), Counter(), torch.Generator().manual_seed(0)
        with Checkpointer(model, opt, job_id="sf", socket=d.socket, root=d.root,
                          state={"data": dl, "counter": counter, "gen": gen}) as ck:
            assert ck.restore() == 17 and ck.restored_rank_state
            it = iter(dl)
            assert [next(it).tolist() for _ in range(3)] == want
            assert counter.n == 16 and torch.equal(counter.t, torch.full((3,), 16.0))
            assert counter.a.tolist() == [16, -16]
            assert torch.equal(torch.rand(4, generator=gen), want_gen)
        assert d.stop() == 0, d.log()

    class Opaque:
        def state_dict(self):
            return {"fn": len}

        def load_state_dict(self, sd):
            pass

    model, opt = make(lambda p: torch.optim.SGD(p, lr=0.1))
    raises(TypeError, Checkpointer, model, opt, job_id="sf", socket=NO_DAEMON,
           state={"x": Opaque()}, match="plain data")
    raises(TypeError, Checkpointer, model, opt, job_id="sf", socket=NO_DAEMON,
           state={"x": object()}, match="without state_dict")
    raises(ValueError, Checkpointer, model, opt, job_id="sf", socket=NO_DAEMON,
           state={"a/b": Counter()}, match="state name")
    # The rank's blob is sized at twice its state at construction (at least
    # extra_bytes).
    counter = Counter()
    with Checkpointer(model, opt, job_id="sf", socket=NO_DAEMON, state={"c": counter},
                      extra_bytes=4096) as ck:
        capacity = ck._blobs["rank"].array.size
        assert 4096 < capacity < 65536, capacity
    big = Counter()
    big.t = torch.zeros(10000)
    with Checkpointer(model, opt, job_id="sf", socket=NO_DAEMON, state={"c": big},
                      extra_bytes=4096) as ck:
        assert ck._blobs["rank"].array.size >= 80000
        ck.step(1)


def test_state_blobs_grow_in_place():
    """A state blob its state outgrows is replaced by a larger one at step()
    (zccd registers the rank again in place: the EMA goes on exactly as in a
    job whose blobs were large enough from the start); a trainer started
    afresh, its blobs sized small, restores the grown step; a growth zccd
    refuses (its staging budget) is an error naming the parts, the step is
    not snapshotted and the old registration goes on."""
    flags = ["--retain_snapshots_s=60", "--staging_budget_mb=24"]

    def run(d, job, extra, grow):
        torch.manual_seed(0)
        model, opt = make(lambda p: torch.optim.AdamW(p, lr=0.01))
        user = {"hist": []}
        ck = Checkpointer(model, opt, job_id=job, socket=d.socket, root=d.root, save_every=4,
                          ema_decay=0.9, backpressure="block", user_state=user,
                          extra_bytes=extra)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train(model, opt, 12, ckpt=ck,
                  before_step=lambda step: user["hist"].append("x" * (3000 * step if grow else 1)))
        grew = [str(w.message) for w in caught if "grew to" in str(w.message)]
        ck.flush()
        d.wait_latest(job, 12)
        ema = {k: v.clone() for k, v in ck.ema_state_dict(include_buffers=False).items()}
        want = {k: v.clone() for k, v in model.state_dict().items()}
        ck.close(keep_snapshots=True)
        return ema, want, user, grew

    with Zccd("grow", extra_flags=flags) as d:
        ema, model_at_12, user, grew = run(d, "grows", 4096, True)
        assert len(grew) >= 3 and "zcc.r00000.rank_state" in grew[0], grew
        ema_ref, ref_at_12, _, none = run(d, "large", 1 << 20, False)
        assert not none
        # Growth re-registers; the training and the EMA are the same.
        for k in ref_at_12:
            assert torch.equal(model_at_12[k], ref_at_12[k]), k
        for k in ema_ref:
            assert torch.equal(ema[k], ema_ref[k]), k

        # Started afresh, blobs sized for an empty history: the restore grows
        # them to the step's and brings back every part.
        model, opt = make(lambda p: torch.optim.AdamW(p, lr=0.01))
        restored_user = {"hist": []}
        with Checkpointer(model, opt, job_id="grows", socket=d.socket, root=d.root,
                          ema_decay=0.9, user_state=restored_user, extra_bytes=4096) as ck:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert ck.restore() == 12
            assert restored_user == user
            for k, v in model.state_dict().items():
                assert torch.equal(v, model_at_12[k]), k
            got = ck.ema_state_dict(include_buffers=False)
            for k in ema:
                assert torch.equal(got[k], ema[k]), k

        # Refused by zccd: a blob of 3 slots x 16 MB does not fit 24 MB.
        model, opt = make(lambda p: torch.optim.SGD(p, lr=0.1))
        user = {}
        with Checkpointer(model, opt, job_id="refused", socket=d.socket, root=d.root,
                          save_every=1, backpressure="block", user_state=user) as ck:
            assert ck.step(1) == "enqueued"
            user["huge"] = b"\x01" * (8 << 20)
            e = raises(zcc.ResourceExhaustedError, ck.step, 2, match="refused the larger")
            assert "its parts: user_state" in str(e) and "extra_bytes=" in str(e), str(e)
            del user["huge"]
            assert ck.step(3) == "enqueued"
            ck.flush()
            d.wait_latest("refused", 3)
        assert d.stop() == 0, d.log()


def _grown_blob_rank(rank, sock, root, phase, port, out):
    """One of test_grown_blobs_restore_on_two_ranks' ranks (spawned)."""
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    warnings.simplefilter("ignore")
    model, opt = make(lambda p: torch.optim.AdamW(p, lr=0.01))
    user = {"hist": []}
    ck = Checkpointer(model, opt, job_id="g2", socket=sock, root=root, save_every=4,
                      ema_decay=0.9, user_state=user, extra_bytes=4096, rank=rank, world_size=2,
                      backpressure="block")
    if phase == "train":
        # Rank 1's state grows four times as fast as rank 0's.
        train(model, opt, 8, ckpt=ck,
              before_step=lambda s: user["hist"].append("x" * (2000 * s * (3 * rank + 1))))
        ck.flush()
        out.put((rank, 8, user, {k: v.numpy().copy() for k, v in model.state_dict().items()}))
        ck.close(keep_snapshots=True)
    else:
        step = ck.restore()
        out.put((rank, step, user, {k: v.numpy().copy() for k, v in model.state_dict().items()}))
        ck.close()
    dist.destroy_process_group()


def test_grown_blobs_restore_on_two_ranks():
    """Two ranks whose blobs grew at different steps; two fresh ranks, their
    blobs sized small, restore together (the restore grows each rank's own,
    then both read again) every rank's state exactly."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    results = {}
    with Zccd("grow2", extra_flags=["--retain_snapshots_s=60"]) as d:
        for n, phase in enumerate(("train", "restore")):
            out = ctx.Queue()
            ranks = [ctx.Process(target=_grown_blob_rank,
                                 args=(r, d.socket, d.root, phase, 29500 + os.getpid() % 1000 + n,
                                       out)) for r in range(2)]
            for p in ranks:
                p.start()
            got = sorted((out.get(timeout=120) for _ in ranks), key=lambda x: x[0])
            for p in ranks:
                p.join(60)
                assert p.exitcode == 0, (phase, p.exitcode, d.log()[-3000:])
            results[phase] = got
        assert d.stop() == 0, d.log()
    for (rank, step, user, model), (_, got_step, got_user, got_model) in zip(results["train"],
                                                                            results["restore"]):
        assert got_step == step == 8
        assert got_user == user and len(user["hist"]) == 8, rank
        for k in model:
            assert np.array_equal(got_model[k], model[k]), (rank, k)


def test_state_tensors_written_again_when_they_change():
    """A state tensor handed back at every step (a sampler's generator
    state) is served from what was written while it is unchanged; whatever
    changes it (a torch op, a NumPy view, which autograd does not see, a
    resize) is written again."""
    from zcc import _plain_state, _torch_codec
    codec = _torch_codec.TorchCodec()
    blob = Blob("test", 4096, codec)
    t = torch.arange(8, dtype=torch.int32)

    def written():
        blob.write({"t": t})
        return _plain_state.restore_hyperparameter(None, blob.read(), codec)["t"]

    assert torch.equal(written(), t)
    assert torch.equal(written(), t)
    for change in (lambda: t.add_(1), lambda: t.numpy().__setitem__(3, 99),
                   lambda: t.resize_(4), lambda: t.resize_(6)):
        change()
        want = t.clone()
        assert torch.equal(written(), want), change
        assert torch.equal(written(), want), change


def test_state_tensors_watched_only_when_handed_back_again():
    """Only a tensor handed back again is kept and watched: a state that
    makes a fresh tensor at every step (Generator.get_state()) leaves none
    behind, and pays no copy for a watch."""
    import gc
    import weakref
    from zcc import _plain_state, _torch_codec
    codec = _torch_codec.TorchCodec()
    blob = Blob("test", 1 << 16, codec)
    gen = torch.Generator().manual_seed(3)
    fresh = []
    for _ in range(40):
        state = gen.get_state()
        fresh.append(weakref.ref(state))
        blob.write({"g": state})
        got = _plain_state.restore_hyperparameter(None, blob.read(), codec)["g"]
        assert torch.equal(got, state)
        torch.rand(1, generator=gen)
        del state
    gc.collect()
    # None kept alive (the blob's pickler may hold the last one it wrote).
    assert all(r() is None for r in fresh[:-1])
    assert not codec._seen
    same = torch.arange(16, dtype=torch.int64)
    for _ in range(3):
        blob.write({"s": same})
    assert codec._seen.get(id(same), (None,))[0] is same


def test_state_loader_refuses_code():
    blob = Blob("test", 1024)
    blob.write({"a": [1, 2]})
    assert blob.read() == {"a": [1, 2]}
    for payload in (pickle.dumps(torch.nn.Linear),  # needs a class lookup
                    b"\x80\x04cbuiltins\neval\n(V1\ntR.",  # eval("1")
                    b"\x80\x04cos\ngetcwd\n)R."):
        blob.array[:8] = list(len(payload).to_bytes(8, "little"))
        blob.array[8:8 + len(payload)] = np.frombuffer(payload, np.uint8)
        raises(pickle.UnpicklingError, blob.read, match="refusing")


def test_state_pickles_tensors_and_containers_as_plain_data():
    """A blob stores tensors, NumPy arrays and numbers and container
    subclasses (what state dicts hold) as plain data, pickled in one pass:
    they come back as tensors (restore_hyperparameter), arrays, Python numbers
    and the base containers. A number's subclass is refused, naming where."""
    import collections
    import enum
    from zcc import _plain_state, _torch_codec
    codec = _torch_codec.CODEC
    gen = torch.Generator().manual_seed(7)
    value = {"sampler": collections.OrderedDict(generator=gen.get_state(), yielded=3),
             "window": torch.arange(6, dtype=torch.bfloat16)[1:5],
             "strided": torch.arange(12.).reshape(3, 4)[:, 1],
             "empty": torch.zeros(0, 2), "lr": np.float32(0.5), "n": np.int64(4), "ok": np.bool_(1),
             "array": np.arange(4, dtype=np.int16), "seen": {1, 2}, "pairs": [(1, "a")]}
    blob = Blob.sized_for("test", value, 1024, codec)
    blob.write(value)
    got = _plain_state.restore_hyperparameter(None, blob.read(), codec)
    assert type(got["sampler"]) is dict and got["sampler"]["yielded"] == 3
    assert torch.equal(got["sampler"]["generator"], gen.get_state())
    for k in ("window", "strided", "empty"):
        assert got[k].dtype == value[k].dtype and torch.equal(got[k], value[k]), k
    assert type(got["lr"]) is float and got["lr"] == 0.5
    assert type(got["n"]) is int and got["n"] == 4 and got["ok"] is True
    assert got["array"].dtype == np.int16 and np.array_equal(got["array"], value["array"])
    assert got["seen"] == {1, 2} and got["pairs"] == [(1, "a")]

    class Color(enum.IntEnum):
        RED = 1
    raises(TypeError, lambda: blob.write({"a": [0, {"c": Color.RED}]}),
           match="test['a'][1]['c'] is a Color")
    raises(TypeError, lambda: blob.write({"f": len}), match="builtin_function_or_method")
    raises(TypeError, lambda: blob.write({"o": np.array([object()])}), match="ndarray")


if __name__ == "__main__":
    run_tests(globals())
