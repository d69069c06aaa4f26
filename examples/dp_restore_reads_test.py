"""Four data-parallel ranks (gloo, CPU) of examples/train_mlp.py on two zccds
sharing one checkpoint root, as on two nodes: after a restart with both
zccds' memory gone, the job restores from disk reading each replicated
tensor once in all (each rank reads what it writes and receives the rest by
broadcast), counted by the zccds' zcc_restore_bytes_read_total. The first
loss after resuming (computed from the restored parameters and RNG, before
any gradient exchange) equals the uninterrupted run's bit for bit, and the
four replicas end identical. (Later losses match to float rounding only: a
fresh DDP process sums its first step's gradients in its initial bucket
layout, a different order over four ranks than the long-running process,
whatever restored it.)
"""

import glob
import json
import os
import tempfile
import urllib.request

from ddp_resume_test import free_port, run_ranks, run_ranks_and_kill, start_ranks
from resume_test import same_tensors
from zccd_process import Zccd

STEPS, WORLD = 20, 4


def bytes_read(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("zcc_restore_bytes_read_total "):
                return int(float(line.split()[1]))
    raise AssertionError("zccd on port %d exports no zcc_restore_bytes_read_total" % port)


def tensor_bytes(step_dir):
    """Bytes of the tensors the step holds (EMA aside), from its manifests."""
    total = 0
    for path in glob.glob(os.path.join(step_dir, "r*.manifest.json")):
        with open(path) as f:
            total += sum(t["nbytes"] for t in json.load(f)["tensors"] if t["kind"] != "ema")
    return total


def main():
    out = tempfile.mkdtemp(prefix="zccdpreads.", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
    root = os.path.join(out, "ckpt")
    ports = [free_port(), free_port()]
    daemons = [Zccd("dp%d" % i, extra_flags=["--root=" + root, "--retain_snapshots_s=0",
                                              "--metrics_listen=127.0.0.1:%d" % ports[i]])
               for i in range(2)]
    for d in daemons:
        d.start()
    try:
        sockets = ",".join(d.socket for d in daemons)
        common = ["--socket", sockets, "--root", root, "--save-every", "10", "--ema-decay", "0",
                  "--backpressure", "block"]
        full = run_ranks(common + ["--job", "full", "--steps", str(STEPS),
                                   "--dump", os.path.join(out, "full")], world=WORLD)
        run_ranks_and_kill(common + ["--job", "dp", "--steps", str(STEPS), "--pause-after",
                                     str(STEPS // 2), "--wait-commit", str(STEPS // 2)], world=WORLD)
        step_dir = os.path.join(root, "dp", "step-%08d" % (STEPS // 2))
        assert os.path.exists(os.path.join(step_dir, "COMMITTED")), os.listdir(os.path.dirname(step_dir))
        on_disk = tensor_bytes(step_dir)
        # Both zccds restart: the resumed job reads the disk.
        for d in daemons:
            assert d.stop() == 0, d.log()
            d.start()
        before = [bytes_read(p) for p in ports]
        assert before == [0, 0], before
        resumed = run_ranks(common + ["--job", "dp", "--steps", str(STEPS),
                                      "--dump", os.path.join(out, "dp")], world=WORLD)
        read = [bytes_read(p) for p in ports]
        first = STEPS // 2 + 1
        for rank, (losses, vals) in enumerate(resumed):
            assert vals["restored"] == str(STEPS // 2) and vals["from"] == "disk", (rank, vals)
            assert sorted(losses) == list(range(first, STEPS + 1)), (rank, sorted(losses))
            assert losses[first] == full[rank][0][first], (rank, losses[first], full[rank][0][first])
            for s in losses:
                a, b = float.fromhex(losses[s]), float.fromhex(full[rank][0][s])
                assert abs(a - b) <= 1e-5 * abs(b), (rank, s, a, b)
            same_tensors(os.path.join(out, "dp", "rank0", "final.safetensors"),
                         os.path.join(out, "dp", "rank%d" % rank, "final.safetensors"),
                         "rank 0 and rank %d final parameters" % rank)
        # Each tensor of the step read once by the job: the replicated model
        # and optimizer tensors by their writer only, each rank's own state by it.
        assert sum(read) == on_disk, (read, on_disk, [d.log() for d in daemons])
        assert min(read) > 0, read
        print("4 ranks on 2 zccds: restored step %d from disk reading %d bytes in all (%s per "
              "zccd): each of the step's tensors once" % (STEPS // 2, sum(read), read))

        # The second zccd is gone: ranks 2 and 3 cannot register, and every
        # rank's restore fails with the reason instead of ranks 0 and 1
        # waiting for the others in a collective.
        assert daemons[1].stop() == 0, daemons[1].log()
        procs = start_ranks(common + ["--job", "dp", "--steps", str(STEPS),
                                      "--connect-timeout", "2"], world=WORLD)
        outs = [p.communicate(timeout=120)[0] for p in procs]
        for rank, (p, out) in enumerate(zip(procs, outs)):
            assert p.returncode != 0, (rank, out)
            assert "UnavailableError" in out, (rank, out)
        assert "ranks 2, 3 failed; rank 2 failed to list its restorable steps" in outs[0], outs[0]
        assert "not registered with zccd after 2.0 s" in outs[2], outs[2]
        print("4 ranks, one zccd gone: every rank's restore raised UnavailableError, none hung")
    finally:
        for d in daemons:
            d.close()
    print("dp_restore_reads_test: OK")


if __name__ == "__main__":
    main()
