"""Tests of the zcc Python binding itself, with NumPy arrays and no PyTorch:
the array interfaces, connect()'s options, bad registrations, the
daemon-absent path, snapshots and restores against a zccd (into another
layout too), backpressure, and NumPy's RNG state. They run in Bazel's Python
environment and, against an installed wheel's own zccd, under every CPython
the wheel is built for (tools/wheel/portable_test.sh).

Plain Python: every test_* function runs in order; the run fails at the first
failing test (after printing which). Tests that need zccd start their own.
"""

import os
import signal
import threading
import time

import numpy as np

import zcc
from zcc_testing import NO_DAEMON, FakeCudaArray, raises, run_tests
from zccd_process import Zccd

def test_describe_numpy_dtypes():
    for dtype, name in [(np.float32, "F32"), (np.float16, "F16"), (np.float64, "F64"),
                        (np.int64, "I64"), (np.int32, "I32"), (np.int16, "I16"),
                        (np.int8, "I8"), (np.uint8, "U8"), (np.bool_, "BOOL")]:
        a = np.zeros((2, 3), dtype)
        d = zcc.describe_tensor(a)
        assert d["dtype"] == name and d["shape"] == (2, 3), d
        assert d["data"] == a.ctypes.data and d["nbytes"] == a.nbytes, d
        assert d["memory"] == "host" and d["protocol"] == "__array_interface__", d


def test_describe_device_memory():
    d = zcc.describe_tensor(FakeCudaArray((2, 2), "<f2"))
    assert d["memory"] == "device" and d["dtype"] == "F16", d
    assert d["protocol"] == "__cuda_array_interface__", d


def test_connect_validates_options():
    raises(ValueError, zcc.connect, "bad/job", socket_path=NO_DAEMON)
    raises(ValueError, zcc.connect, "j", socket_path=NO_DAEMON, rank=2, world_size=2)
    raises(ValueError, zcc.connect, "j", socket_path=NO_DAEMON, rank=-1)
    raises(ValueError, zcc.connect, "j", socket_path=NO_DAEMON, backpressure="sometimes",
           match="not one of")
    raises(ValueError, zcc.connect, "j", socket_path=NO_DAEMON, ema_decay=1.5)
    raises(ValueError, zcc.connect, "j", socket_path=NO_DAEMON, copier="gpu")
    with zcc.connect("j", socket_path=NO_DAEMON, backpressure=zcc.Backpressure.BLOCK) as c:
        assert c.copier == "host"


def test_store_credentials_are_checked_and_reach_zccd():
    connect = zcc.connect
    raises(ValueError, connect, "j", socket_path=NO_DAEMON,
           store_credentials={"aws_access_key_id": "AKIAEXAMPLE"}, match="aws_secret_access_key")
    raises(ValueError, connect, "j", socket_path=NO_DAEMON,
           store_credentials={"key": "k", "secret": "s"}, match="unknown keys")
    raises(TypeError, connect, "j", socket_path=NO_DAEMON, store_credentials=("k", "s"))
    saved = {k: os.environ.pop(k, None) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    try:
        raises(ValueError, connect, "j", socket_path=NO_DAEMON, store_credentials="environment",
               match="AWS_ACCESS_KEY_ID")
    finally:
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v
    # zccd gets them, and refuses them for a root that is not an object store,
    # without ever showing the secret.
    secret = "secretNeverShown0123456789"
    with Zccd("keys") as d:
        with connect("kj", socket_path=d.socket, checkpoint_root=d.root,
                     store_credentials={"aws_access_key_id": "AKIAEXAMPLE",
                                        "aws_secret_access_key": secret}) as c:
            e = raises(zcc.InvalidArgumentError, c.register_tensors,
                       [zcc.TensorSpec("w", np.zeros(4, np.float32))], match="s3://")
            assert secret not in str(e)
        assert secret not in d.log()
        # The tiered mode's root must be an object store.
        with connect("tj", socket_path=d.socket, checkpoint_root=d.root,
                     upload_root="/not/a/store") as c:
            raises(zcc.InvalidArgumentError, c.register_tensors,
                   [zcc.TensorSpec("w", np.zeros(4, np.float32))], match="not an object store")
        # Node-local roots are for the tiered mode: without a store to meet
        # in, the nodes' parts of a step could never commit.
        with connect("nj", socket_path=d.socket, checkpoint_root=d.root,
                     node_local_root=True) as c:
            raises(zcc.InvalidArgumentError, c.register_tensors,
                   [zcc.TensorSpec("w", np.zeros(4, np.float32))], match="needs an upload_root")
        # A run id is plain printable text (it goes into every manifest).
        with connect("rj", socket_path=d.socket, checkpoint_root=d.root,
                     run_id="run 1") as c:
            raises(zcc.InvalidArgumentError, c.register_tensors,
                   [zcc.TensorSpec("w", np.zeros(4, np.float32))], match="run_id must be")


def test_bad_registrations():
    with zcc.connect("j", socket_path=NO_DAEMON) as c:
        a, b = np.zeros(4, np.float32), np.zeros(4, np.float32)
        raises(ValueError, c.register_tensors,
               [zcc.TensorSpec("w", a), zcc.TensorSpec("w", b)], match="registered twice")
        raises(ValueError, c.register_tensors, [zcc.TensorSpec('bad"name', a)])
        raises(ValueError, c.register_tensors, [zcc.TensorSpec("nc", np.zeros((4, 4), np.float32)[::2])],
               match="tensor 'nc'")
        raises(ValueError, c.register_tensors, [zcc.TensorSpec("c", np.zeros(2, np.complex128))])
        raises(ValueError, c.register_tensors, [zcc.TensorSpec("dev", FakeCudaArray())],
               match="device memory")
        raises(ValueError, zcc.TensorSpec, "w", a, kind="weights", match="not one of")
        raises(ValueError, c.register_tensors, [zcc.TensorSpec("p", a, optional=True)],
               match="only EXTRA tensors may be optional")
        raises(TypeError, c.register_tensors, [("w", a)])
        # Nothing was registered by the failures: a good registration works once.
        c.register_tensors([zcc.TensorSpec("w", a, kind="param", ema_eligible=True),
                            zcc.TensorSpec("m", b, kind=zcc.TensorKind.OPTIM)])
        e = raises(zcc.FailedPreconditionError, c.register_tensors, [zcc.TensorSpec("x", a)])
        assert isinstance(e, RuntimeError)
    raises(zcc.FailedPreconditionError, c.snapshot, 1, match="closed")


def test_daemon_absent_never_hangs():
    start = time.monotonic()
    c = zcc.connect("absent", socket_path=NO_DAEMON, rpc_timeout=2.0)
    a = np.zeros(1024, np.float32)
    c.register_tensors([zcc.TensorSpec("w", a)])
    for step in range(1, 6):
        c.fence()
        assert c.snapshot(step) == "skipped_disconnected"
    s = c.stats()
    assert not s["connected"] and s["skipped_disconnected"] == 5 and s["last_error"], s
    assert s["checkpoint_failures"] == 0 and s["last_failed_checkpoint_step"] == -1, s
    assert s["replaced_by_checkpoint"] == 0, s
    e = raises(zcc.UnavailableError, c.restore)
    assert isinstance(e, ConnectionError)
    raises(ConnectionError, c.checkpoint_status)
    st = c.status()
    assert st["checkpoint"] is None and "UNAVAILABLE" in st["checkpoint_error"], st
    raises(ConnectionError, c.read_ema)
    c.flush(1.0)
    c.close()
    assert c.closed
    elapsed = time.monotonic() - start
    assert elapsed < 10, "daemon-absent calls took %.1f s" % elapsed


def test_wait_connected_wakes_when_zccd_arrives():
    d = Zccd("wc")
    try:
        c = zcc.connect("waits", socket_path=d.socket, rpc_timeout=2.0,
                        reconnect_max_backoff=0.2)
        a = np.zeros(1024, np.float32)
        c.register_tensors([zcc.TensorSpec("w", a)])  # zccd absent: retried in the background
        start = time.monotonic()
        assert not c.wait_connected(0.3)
        assert time.monotonic() - start >= 0.29
        raises(ValueError, c.wait_connected, -1)
        d.start()
        assert c.wait_connected(30.0), c.stats()
        assert c.stats()["connected"]
        # The EMA read that waits for a step answers at once without an EMA.
        raises(zcc.FailedPreconditionError, c.read_ema, min_step=1, timeout=5.0)
        c.close()
    finally:
        d.__exit__(None, None, None)  # stops zccd, removes its directory


def test_sliced_tensors_restore_into_another_layout():
    with Zccd("slice") as d:
        def connect(rank, world):
            return zcc.connect("sl", socket_path=d.socket, checkpoint_root=d.root, rank=rank,
                               world_size=world, save_every=1, backpressure="block")
        full = np.arange(12, dtype=np.float32).reshape(4, 3)
        # Two ranks each hold two rows of the global [4, 3] tensor.
        clients, pieces = [], []
        for rank in range(2):
            piece = full[2 * rank:2 * rank + 2].copy()
            c = connect(rank, 2)
            c.register_tensors([zcc.TensorSpec("w", piece, global_shape=(4, 3),
                                               offset=(2 * rank, 0))])
            clients.append(c)
            pieces.append(piece)
        for c in clients:
            c.fence()
            assert c.snapshot(1) == "enqueued"
            c.flush()
        d.wait_latest("sl", 1)
        for c in clients:
            c.close()
        # One rank restores the whole tensor; three ranks restore column pieces.
        whole = np.zeros((4, 3), np.float32)
        c = connect(0, 1)
        c.register_tensors([zcc.TensorSpec("w", whole)])
        assert c.restore() == 1
        assert np.array_equal(whole, full), whole
        c.close()
        for rank in range(3):
            col = np.zeros((4, 1), np.float32)
            c = connect(rank, 3)
            c.register_tensors([zcc.TensorSpec("w", col, global_shape=[4, 3], offset=[0, rank])])
            assert c.restore() == 1
            assert np.array_equal(col[:, 0], full[:, rank]), col
            c.close()
        # Per-rank state of a rank the step's job did not have: optional
        # EXTRA tensors come back as zeros, named in "missing"; the rest as
        # written. Not optional, the restore is refused, nothing copied.
        whole[:] = 0
        mine = np.full(8, 7, np.uint8)
        c = connect(0, 1)
        c.register_tensors([zcc.TensorSpec("w", whole),
                            zcc.TensorSpec("zcc.r00005.state", mine, kind="extra", optional=True)])
        got = c.restore_tensors()
        assert got["step"] == 1 and got["missing"] == ["zcc.r00005.state"], got
        assert np.array_equal(whole, full) and not mine.any(), (whole, mine)
        c.close()
        whole[:] = 0
        mine[:] = 7
        c = connect(0, 1)
        c.register_tensors([zcc.TensorSpec("w", whole),
                            zcc.TensorSpec("zcc.r00005.state", mine, kind="extra")])
        raises(zcc.FailedPreconditionError, c.restore_tensors, match="zcc.r00005.state")
        assert not whole.any() and (mine == 7).all(), (whole, mine)
        c.close()
        # Files stored with the job land in its directory (export copies them).
        c = connect(0, 1)
        c.register_tensors([zcc.TensorSpec("w", whole)])
        c.put_job_file("config.json", b'{"model_type": "mlp"}')
        c.put_job_file("config.json", b'{"model_type": "mlp2"}')  # replaced
        with open(os.path.join(d.root, "sl", "metadata", "config.json"), "rb") as f:
            assert f.read() == b'{"model_type": "mlp2"}'
        raises(ValueError, c.put_job_file, "../evil", b"x", match="job file name")
        raises(ValueError, c.put_job_file, ".hidden", b"x", match="job file name")
        raises(ValueError, c.put_job_file, "big.bin", b"x" * (16 * 1024 * 1024 + 1), match="limit")
        c.close()
        # A piece without its offset, or one that leaves the global tensor.
        raises(ValueError, zcc.TensorSpec, "w", whole, global_shape=(4, 3))
        c = connect(0, 1)
        raises(ValueError, c.register_tensors,
               [zcc.TensorSpec("w", whole, global_shape=(4, 3), offset=(1, 0))], match="box")
        c.close()
        assert d.stop() == 0, d.log()


def _stop(proc):
    os.kill(proc.pid, signal.SIGSTOP)
    # Stopped once every thread has taken the signal, which on a busy machine
    # is not at once.
    deadline = time.monotonic() + 10
    while open("/proc/%d/stat" % proc.pid).read().split(")")[-1].split()[0] != "T":
        assert time.monotonic() < deadline, "zccd did not stop"
        time.sleep(0.001)


def test_block_never_replaces_a_snapshot():
    """With backpressure "block" a due step waits for a free slot; with "skip"
    it takes over an ordinary snapshot zccd has not ingested (whose EMA update
    is then lost, and counted)."""
    for mode in ("block", "skip"):
        with Zccd("blk-" + mode) as d:
            c = zcc.connect("blk", socket_path=d.socket, checkpoint_root=d.root, save_every=4,
                            num_slots=3, backpressure=mode, daemon_timeout=30.0, ema_decay=0.5)
            c.register_tensors([zcc.TensorSpec("w", np.zeros(4, np.float32), ema_eligible=True)])
            _stop(d.proc)  # nothing is ingested: every published slot stays READY
            result = {}
            try:
                for step in (1, 2, 3):
                    c.fence()
                    assert c.snapshot(step) == "enqueued"
                c.flush(5.0)
                th = threading.Thread(target=lambda: result.update(r=c.snapshot(4)))
                th.start()
                th.join(1.0)
                waiting = th.is_alive()
            finally:
                os.kill(d.proc.pid, signal.SIGCONT)
            th.join(20)
            assert result.get("r") == "enqueued", (mode, result)
            stats = c.stats()
            if mode == "block":
                assert waiting, "the due step did not wait for a free slot"
                assert stats["replaced_by_checkpoint"] == 0, stats
            else:
                assert not waiting, "the due step waited although a snapshot could be replaced"
                assert stats["replaced_by_checkpoint"] == 1, stats
            c.close()
            assert d.stop() == 0, d.log()


def test_a_trainer_whose_rank_was_taken_over_snapshots_nothing_there():
    """zccd took this trainer for dead (stalled past its heartbeat timeout
    where zccd cannot see the process) and gave its shared memory to a
    trainer of the rank that registered after it, which it then marks with
    its registration's generation: the first trainer, going on, publishes
    nothing there and says why."""
    with Zccd("over") as d:
        c = zcc.connect("over", socket_path=d.socket, checkpoint_root=d.root,
                        daemon_timeout=30.0, backpressure="block")
        c.register_tensors([zcc.TensorSpec("w", np.zeros(4, np.float32))])
        c.fence()
        assert c.snapshot(1) == "enqueued"
        c.flush(10.0)
        names = [n for n in os.listdir("/dev/shm") if n.startswith(d.shm_prefix + ".over.")]
        assert len(names) == 1, names
        with open("/dev/shm/" + names[0], "r+b") as f:
            f.seek(16)  # ControlBlock.generation (after magic, version, num_slots)
            generation = int.from_bytes(f.read(8), "little")
            f.seek(16)
            f.write((generation + 1).to_bytes(8, "little"))
        c.fence()
        assert c.snapshot(2) == "skipped_disconnected"
        stats = c.stats()
        assert "registered after this one" in stats["last_error"], stats
        c.close()
        assert d.stop() == 0, d.log()


def test_generator_states_read_only_when_they_moved():
    """zcc reads Python's and NumPy's global generators again only when
    they moved; whatever moved them (draws, a Gaussian cached or used, seed,
    set_state, setstate, a bit generator swapped in), what it returns equals
    their public states."""
    import random
    from zcc import _rng_state

    states = _rng_state.GeneratorStates()

    def same():
        name, keys, pos, has_gauss, cached = np.random.get_state()
        version, words, gauss = random.getstate()
        got = states.state()
        assert got["numpy_random"] == (name, keys.astype("<u4").tobytes(), int(pos),
                                       int(has_gauss), float(cached)), "NumPy state differs"
        assert got["python_random"] == (version, b"".join(w.to_bytes(4, "little") for w in words),
                                        gauss), "Python state differs"
        return got

    np.random.seed(3)
    random.seed(3)
    first = same()
    assert states._watch is not None  # the fast path is in use
    assert same() is first  # unchanged: served from what was read
    draws = (lambda: np.random.rand(5), lambda: np.random.randint(0, 9, 700),
             lambda: np.random.seed(4), lambda: np.random.set_state(np.random.get_state()),
             lambda: random.random(), lambda: random.seed(5), lambda: random.getrandbits(9000),
             lambda: random.setstate(random.getstate()))
    for draw in draws:
        draw()
        same()
        same()
    # A Gaussian cached, then used without a word of the generator moving:
    # NumPy's legacy pair and Python's gauss() alike.
    for gaussian in (np.random.standard_normal, lambda: random.gauss(0, 1),
                     np.random.standard_normal, lambda: random.gauss(0, 1)):
        gaussian()
        same()
        same()
    # setstate back to a state with a cached Gaussian and the same words.
    random.seed(6)
    random.gauss(0, 1)
    with_gauss = random.getstate()
    random.gauss(0, 1)  # uses the cached one
    same()
    random.setstate(with_gauss)
    same()
    saved = np.random.mtrand._rand._bit_generator
    np.random.set_bit_generator(np.random.MT19937(11))
    try:
        same()
        np.random.rand(2)
        same()
    finally:
        np.random.set_bit_generator(saved)
    same()


if __name__ == "__main__":
    run_tests(globals())
