"""Four data-parallel ranks of a zcc.torch job on two zccds (ranks 0-1 on one,
2-3 on the other, as on two nodes sharing a checkpoint file system), in real
torchrun jobs (gloo, CPU). The job checkpoints a plain model and AdamW (every
tensor replicated on all four ranks; each piece written once, by the replica
the shard assigner picked). Both zccds then restart, so their memory is gone,
and the job restores from disk: every rank's model and optimizer state equal
the saved ones, and the job read each piece of the checkpoint once between
its ranks (each rank reads the pieces it wrote and receives the rest from
their writer over the process group). The count is zccd's own,
zcc_restore_bytes_read_total summed over both zccds, against the bytes of
the pieces the ranks' manifests list; a job whose ranks each read the whole
model would read the model and optimizer state four times.
"""

import glob
import json
import os
import socket
import tempfile
import urllib.request

from dtensor_test import torchrun
from zccd_process import Zccd

JOB = "dp"
STEPS = 4


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def restore_bytes_read(port):
    """zcc_restore_bytes_read_total from the zccd serving metrics on `port`."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("zcc_restore_bytes_read_total"):
                return int(float(line.split()[-1]))
    raise AssertionError("zccd on port %d exports no zcc_restore_bytes_read_total" % port)


def tensor_bytes_on_disk(step_dir):
    """The bytes of every piece of a step, from its ranks' manifests (each
    piece of a checkpoint is written by exactly one rank): the model and
    optimizer shards and each rank's extras (RNG and trainer state)."""
    manifests = glob.glob(os.path.join(step_dir, "r*.manifest.json"))
    assert len(manifests) == 4, manifests
    total = 0
    for path in manifests:
        with open(path) as f:
            total += sum(t["nbytes"] for t in json.load(f)["tensors"] if t["kind"] != "ema")
    return total


def main():
    ref = tempfile.mkdtemp(prefix="zccdp.", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
    ports = [free_port(), free_port()]
    with Zccd("dpa", ["--metrics_listen=127.0.0.1:%d" % ports[0]]) as a, \
            Zccd("dpb", ["--metrics_listen=127.0.0.1:%d" % ports[1]], root=a.root) as b:
        sockets = ",".join([a.socket, b.socket])
        # No EMA: its state is read apart from the tensors counted here.
        common = ["--layout", "dp", "--job", JOB, "--ref", ref, "--socket", sockets,
                  "--root", a.root, "--steps", str(STEPS), "--expect-step", str(STEPS),
                  "--ema-decay", "0"]
        torchrun(4, ["save"] + common)
        a.wait_latest(JOB, STEPS)
        for d in (a, b):
            assert d.stop() == 0, d.log()
            d.start()
        assert restore_bytes_read(ports[0]) + restore_bytes_read(ports[1]) == 0
        lines = torchrun(4, ["restore", "--expect-from", "disk"] + common)
        assert len(lines) == 4, lines  # every rank checked the whole state
        read = [restore_bytes_read(p) for p in ports]
        on_disk = tensor_bytes_on_disk(os.path.join(a.job_dir(JOB), "step-%08d" % STEPS))
        print("dp_restore_test: the job read %d + %d bytes from disk (zccd a, b); the step "
              "holds %d bytes of pieces" % (read[0], read[1], on_disk))
        assert all(r > 0 for r in read), "a node read nothing: %s" % read
        assert sum(read) == on_disk, (read, on_disk)
        for d in (a, b):
            assert d.stop() == 0, d.log()
    print("dp_restore_test: OK")


if __name__ == "__main__":
    main()
