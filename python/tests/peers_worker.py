"""One rank of peers_test.py, under torchrun (gloo, CPU): rank r registers a
small model and AdamW with the zccd whose socket is the r-th of --sockets,
and prints what its Checkpointer learnt of the peer tier.

    peers_worker.py --sockets S0,S1,... --roots R0,R1,... --job J

(each rank's zccd with its own node-local root).
"""

import argparse
import os

import torch
import torch.distributed as dist

from zcc.torch import Checkpointer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sockets", required=True)
    p.add_argument("--roots", required=True)
    p.add_argument("--job", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sockets, roots = args.sockets.split(","), args.roots.split(",")
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters())
    ckpt = Checkpointer(model, opt, job_id=args.job, socket=sockets[rank % len(sockets)],
                        root=roots[rank % len(roots)], rank=rank, world_size=world)
    print("rank=%d peer_address=%s buddies=%s" % (rank, ckpt.client.peer_address,
                                                  ",".join(ckpt.peer_buddies)), flush=True)
    ckpt.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
