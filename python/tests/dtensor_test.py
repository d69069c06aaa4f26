"""DTensor models (FSDP2, tensor parallel, FSDP2 x TP) checkpointed by
zcc.torch and restored into other layouts, in real torchrun jobs (gloo, CPU)
against a real zccd; see dtensor_worker.py for what each run checks.

  FSDP2 over 4 ranks (uneven shards, one rank holding no rows of the head)
    -> the same 4 ranks from zccd's memory, FSDP2 over 2 ranks, 1 plain rank
  TP over 2 ranks -> FSDP2 over 2 ranks, TP over 4 ranks, 1 plain rank
  FSDP2 x TP on a 2 x 2 mesh -> TP over 2 ranks, 1 plain rank
  FSDP2 on 1 rank -> 2 ranks -> 4 ranks (each trained on and checkpointed) -> 3
  FSDP2 over 4 ranks, newest step only in zccd's memory -> FSDP2 over 2 ranks,
    and -> TP over 4 ranks
Every restore must reproduce the saved global model, AdamW and LR scheduler
state element for element, and give each rank the generators and user_state
its rank saved (a rank new to the job: its own generators, rank 0's
user_state). Then a model with a resized or an added parameter is refused
with nothing overwritten, and so are a Partial placement, FSDP1, a
non-contiguous local shard and a tensor on a device zcc cannot copy.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

from zccd_process import Zccd

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "dtensor_worker.py")


def torchrun(nproc, args, timeout=300):
    cmd = [sys.executable, "-W", "ignore::UserWarning", "-m", "torch.distributed.run",
           "--standalone", "--nproc_per_node", str(nproc), WORKER] + args
    start = time.monotonic()
    p = subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        raise AssertionError("torchrun %d x %s failed (%d):\n%s" % (nproc, args, p.returncode, p.stdout))
    lines = [l for l in p.stdout.splitlines() if l.startswith(("saved", "restored", "refused"))]
    print("%d rank(s) %-48s %5.1f s  %s" % (nproc, " ".join(args[:3]), time.monotonic() - start,
                                           lines[0] if lines else ""))
    return lines


def main():
    out = tempfile.mkdtemp(prefix="zccdt.", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
    with Zccd("dt") as d:
        common = ["--socket", d.socket, "--root", d.root, "--steps", "4", "--expect-step", "4"]
        cases = [
            ("fsdp", 4, [(4, "fsdp", "memory"), (2, "fsdp", "disk"), (1, "single", "disk")]),
            ("tp", 2, [(2, "fsdp", "disk"), (4, "tp", "disk"), (1, "single", "disk")]),
            ("fsdp_tp", 4, [(2, "tp", "disk"), (1, "single", "disk")]),
        ]
        for layout, nproc, restores in cases:
            ref = os.path.join(out, layout)
            os.makedirs(ref)
            job = ["--job", layout, "--ref", ref]
            torchrun(nproc, ["save", "--layout", layout] + job + common)
            d.wait_latest(layout, 4)
            # Every rank's manifest names the run rank 0 drew and shared.
            step_dir = os.path.join(d.root, layout, "step-00000004")
            runs = {json.load(open(os.path.join(step_dir, "r%05d.manifest.json" % r)))["run_id"]
                    for r in range(nproc)}
            assert len(runs) == 1 and len(runs.pop()) == 32, step_dir
            for n, into, source in restores:
                lines = torchrun(n, ["restore", "--layout", into, "--expect-from", source] + job + common)
                assert len(lines) == n, lines  # every rank checked the whole state
        # Resumed in another layout with its newest step only in zccd's
        # memory (saved at 4, snapshotted to 6): no rank can adopt its
        # snapshots, so zccd writes step 6 from the old layout's memory into
        # the job's directory, and the new layout restores it, not step 4:
        # on fewer ranks, and on as many ranks in another layout.
        for name, n, into in (("relayout", 2, "fsdp"), ("relayout4", 4, "tp")):
            ref = os.path.join(out, name)
            os.makedirs(ref)
            job = ["--job", name, "--ref", ref, "--socket", d.socket, "--root", d.root]
            torchrun(4, ["save", "--layout", "fsdp", "--steps", "6", "--save-every", "4"] + job)
            d.wait_latest(name, 4)
            lines = torchrun(n, ["restore", "--layout", into, "--expect-step", "6"] + job)
            assert len(lines) == n, lines
            assert re.search(r"job %s: step 6 \(\d+ bytes\) written from memory and committed"
                             % name, d.log()), d.log()
        assert "written without the EMA" not in d.log(), d.log()
        # A job that grows and shrinks: FSDP2 on 1 rank, resumed on 2, then 4,
        # then 3, each resume checked and trained on before the next.
        grow = os.path.join(out, "grow")
        os.makedirs(grow)
        refs = [os.path.join(grow, "ref%d" % i) for i in range(4)]
        for r in refs:
            os.makedirs(r)
        job = ["--job", "grow", "--layout", "fsdp", "--socket", d.socket, "--root", d.root]
        torchrun(1, ["save"] + job + ["--steps", "4", "--ref", refs[0]])
        d.wait_latest("grow", 4)
        for i, (n, step) in enumerate([(2, 4), (4, 6)]):
            lines = torchrun(n, ["resume"] + job + ["--expect-step", str(step), "--steps",
                                                    str(step + 2), "--ref", refs[i],
                                                    "--new-ref", refs[i + 1]])
            assert len([l for l in lines if l.startswith("restored")]) == n, lines
            d.wait_latest("grow", step + 2)
        lines = torchrun(3, ["restore"] + job + ["--expect-step", "8", "--ref", refs[2]])
        assert len(lines) == 3, lines
        # (Only the last rank's model changed: plain models, so that building
        # their full state runs the same collectives on both ranks.)
        for change, layout in (("resized", "fsdp"), ("extra", "fsdp"), ("extra_last", "single")):
            lines = torchrun(2, ["changed", "--layout", layout, "--job", "fsdp", "--change", change]
                             + common)
            assert len(lines) == 2 and all("FailedPrecondition" in l for l in lines), lines
            assert all("gate" in l for l in lines) or change != "extra_last", lines
        lines = torchrun(1, ["refused", "--job", "refused"] + common)
        assert len(lines) == 4, lines
        assert d.stop() == 0, d.log()
    print("dtensor_test: OK")


if __name__ == "__main__":
    main()
