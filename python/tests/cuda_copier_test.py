"""zcc's CUDA copier from Python, without a GPU: the real copier code, built
into zcc._zcc_cuda_fake over the fake CUDA runtime (cuda/fake_cudart), whose
"device" memory is host memory it tracks.

Checks that `import zcc` does not load the CUDA module; that device buffers
(__cuda_array_interface__) snapshot through the copier's cudaMemcpyAsync into
a checkpoint holding exactly their bytes, next to a host tensor; that a new
client restores them into fresh device buffers; and that zcc.cuda_copier()
on this machine (the real runtime, no GPU) fails with a clear error. In a
--config=nocuda build (no fake) it checks that cuda_copier() says zcc was
built without CUDA.
"""

import os
import sys
import time

import numpy as np
from safetensors.numpy import load_file

import zcc
from zccd_process import Zccd

HERE = os.path.dirname(os.path.abspath(zcc.__file__))
FAKE = "zcc._zcc_cuda_fake"


def expect_error(fn, classes, what):
    try:
        fn()
    except classes as e:
        print("%s: %s: %s" % (what, type(e).__name__, e))
        return e
    raise AssertionError("%s did not fail" % what)


def checkpoint_tensors(step_dir):
    out = {}
    for name in os.listdir(step_dir):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(step_dir, name)))
    return out


def snapshot_two_steps(c, d, job, dev, host, rng):
    """Registers the device buffers and `host`, snapshots steps 1 and 2 with
    fresh random bytes, waits for step 2's commit and checks that it holds
    exactly them; closes the client. Returns step 2's bytes."""
    c.register_tensors([zcc.TensorSpec(n, b) for n, b in dev.items()] +
                       [zcc.TensorSpec("host", host, kind="optim")])
    want = {}
    for step in (1, 2):
        c.fence()
        for n, b in dev.items():
            want[n] = rng.integers(0, 256, len(b), dtype=np.uint8)
            b.write(want[n].tobytes())
        host[:] = step
        assert c.snapshot(step) == "enqueued"
    c.flush()
    d.wait_latest(job, 2)
    got = checkpoint_tensors(os.path.join(d.job_dir(job), "step-00000002"))
    for n in dev:
        assert np.array_equal(got[n], want[n]), n
    assert np.all(got["host"] == 2)
    c.close()
    return want


def restore_into_fresh(fake, d, job, sizes, want, host_len, copier):
    """A new client restores step 2 of `job` into fresh device buffers and a
    host tensor, and every byte is what was saved."""
    fresh = {n: fake.FakeDeviceBuffer(s) for n, s in sizes.items()}
    host = np.zeros(host_len, np.float32)
    c = zcc.connect(job, socket_path=d.socket, checkpoint_root=d.root, copier=copier)
    c.register_tensors([zcc.TensorSpec(n, b) for n, b in fresh.items()] +
                       [zcc.TensorSpec("host", host, kind="optim")])
    deadline = time.monotonic() + 30
    while not c.stats()["connected"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert c.restore() == 2
    for n, b in fresh.items():
        assert np.frombuffer(b.read(), np.uint8).tolist() == want[n].tolist(), n
    assert np.all(host == 2)
    c.close()


def round_trip(fake):
    rng = np.random.default_rng(7)
    sizes = {"w": 3 << 20, "b": 4096, "odd": 3}
    dev = {n: fake.FakeDeviceBuffer(s) for n, s in sizes.items()}
    host = np.zeros(1000, np.float32)
    with Zccd("cuda") as d:
        copier = zcc.cuda_copier(module=FAKE)
        c = zcc.connect("cu", socket_path=d.socket, checkpoint_root=d.root, save_every=2,
                        backpressure="block", copier=copier)
        assert c.copier != "host", c.copier
        copies_before = fake.device_copies()
        want = snapshot_two_steps(c, d, "cu", dev, host, rng)
        moved = fake.device_copies() - copies_before
        assert moved >= 2 * len(dev), "the copier issued %d cudaMemcpyAsync" % moved
        print("snapshot: %d device buffers (%d bytes) and a host tensor through %d "
              "cudaMemcpyAsync into step 2, bytes equal" % (len(dev), sum(sizes.values()), moved))

        restore_into_fresh(fake, d, "cu", sizes, want, 1000, zcc.cuda_copier(module=FAKE))
        print("restore: step 2 into fresh device buffers through the copier, bytes equal")

        # A device buffer with the host copier is refused at registration.
        c = zcc.connect("cu2", socket_path=d.socket, checkpoint_root=d.root)
        expect_error(lambda: c.register_tensors([zcc.TensorSpec("w", fake.FakeDeviceBuffer(8))]),
                     zcc.InvalidArgumentError, "device buffer, host copier")
        c.close()
        assert d.stop() == 0, d.log()


def daemon_pull_round_trip(fake):
    """zccd (over the fake runtime too) copies the device buffers itself."""
    zccd = os.path.join(os.environ["TEST_SRCDIR"], "zcc", "daemon", "zccd_on_fake_cudart")
    rng = np.random.default_rng(11)
    sizes = {"w": 2 << 20, "b": 4096}
    dev = {n: fake.FakeDeviceBuffer(s) for n, s in sizes.items()}
    host = np.zeros(100, np.float32)
    with Zccd("pull", extra_flags=["--daemon_pull"], binary=zccd) as d:
        c = zcc.connect("pull", socket_path=d.socket, checkpoint_root=d.root, save_every=2,
                        backpressure="block", copier=zcc.daemon_pull(module=FAKE))
        assert c.copier == "cuda_ipc", c.copier
        copies_before = fake.device_copies()
        want = snapshot_two_steps(c, d, "pull", dev, host, rng)
        # The copies were zccd's: this process issued none.
        assert fake.device_copies() == copies_before, fake.device_copies() - copies_before
        restore_into_fresh(fake, d, "pull", sizes, want, 100, zcc.daemon_pull(module=FAKE))
        assert d.stop() == 0, d.log()
    print("daemon-pull: zccd copied %d device buffers into step 2 (no cudaMemcpyAsync in this "
          "process), restored into fresh buffers, bytes equal" % len(dev))


def main():
    assert "zcc._zcc_cuda" not in sys.modules, "import zcc loaded the CUDA module"
    has_fake = os.path.exists(os.path.join(HERE, "_zcc_cuda_fake.so"))
    if has_fake:
        import importlib
        round_trip(importlib.import_module(FAKE))
        daemon_pull_round_trip(importlib.import_module(FAKE))
        # The real runtime on this machine: no GPU (CI), so a clear error;
        # on a GPU machine a copier.
        try:
            zcc.cuda_copier()
            print("real CUDA copier made (a GPU is present)")
        except (zcc.FailedPreconditionError, zcc.UnavailableError) as e:
            assert "CUDA" in str(e) or "device" in str(e), e
            print("real runtime without a GPU: %s: %s" % (type(e).__name__, e))
    else:
        e = expect_error(zcc.cuda_copier, zcc.UnimplementedError, "built without CUDA")
        assert "CUDA" in str(e), e
    print("cuda_copier_test: OK")


if __name__ == "__main__":
    main()
