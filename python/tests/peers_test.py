"""The peer tier's membership from a real torchrun job (gloo, CPU): three
zccds with peer services (node-a and node-c in rack-1, node-b in rack-2), one
rank on each; zcc.torch exchanges the zccds' peer addresses over the process
group and reports them, and each rank learns its node's buddy: the next node
in another rack. A job on zccds without a peer service exchanges nothing.
"""

import os
import re
import subprocess
import sys

from zccd_process import Zccd

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "peers_worker.py")


def torchrun(nproc, args):
    cmd = [sys.executable, "-W", "ignore::UserWarning", "-m", "torch.distributed.run",
           "--standalone", "--nproc_per_node", str(nproc), WORKER] + args
    p = subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        raise AssertionError("torchrun %d x %s failed (%d):\n%s" % (nproc, args, p.returncode, p.stdout))
    found = {}
    # (The ranks' lines can run into each other in torchrun's output.)
    for m in re.finditer(r"rank=(\d+) peer_address=([0-9.:]*) buddies=([0-9.:,]*)", p.stdout):
        found[int(m.group(1))] = (m.group(2), m.group(3).split(",") if m.group(3) else [])
    assert sorted(found) == list(range(nproc)), p.stdout
    return found


def main():
    nodes = [("node-a", "rack-1"), ("node-b", "rack-2"), ("node-c", "rack-1")]
    zccds = [Zccd("pe%d" % i, extra_flags=["--peer_listen=127.0.0.1:0", "--peer_insecure",
                                           "--node_name=" + n, "--failure_domain=" + r])
             for i, (n, r) in enumerate(nodes)]
    try:
        for d in zccds:
            d.start()
        found = torchrun(3, ["--sockets", ",".join(d.socket for d in zccds), "--roots",
                             ",".join(d.root for d in zccds), "--job", "peers"])
        addresses = [found[r][0] for r in range(3)]
        for r, a in enumerate(addresses):
            assert re.match(r"^127\.0\.0\.1:\d+$", a), (r, a)
            assert zccds[r].log().count("port %s," % a.split(":")[1]) == 1, zccds[r].log()
        # Just after the exchange no failure domain is known yet (each zccd
        # learns them by asking), so every node's buddy is the next one in
        # address order; the choice settles once the domains are known.
        ring = sorted(addresses)
        for r in range(3):
            want = ring[(ring.index(addresses[r]) + 1) % 3]
            assert found[r][1] == [want], (r, found, ring)
        print("peers_test: three zccds learnt the job's nodes from its ranks: %s" % found)
    finally:
        for d in zccds:
            d.close()

    # No peer service: nothing is exchanged, nothing reported.
    with Zccd("pe") as d:
        found = torchrun(2, ["--sockets", d.socket, "--roots", d.root, "--job", "nopeers"])
        assert found == {0: ("", []), 1: ("", [])}, found
    print("peers_test: OK")


if __name__ == "__main__":
    main()
