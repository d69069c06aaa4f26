"""Trains a small Hugging Face causal LM with FSDP2 under torchrun and checkpoints
every step with zcc (EMA included); run it again, with any number of ranks,
and it resumes from the newest checkpoint.

    torchrun --nproc_per_node 4 examples/train_hf.py --socket /tmp/zcc/zccd.sock \\
        --root /tmp/zcc/ckpt --steps 20
    # kill it, then resume in another layout:
    torchrun --nproc_per_node 2 examples/train_hf.py --socket ... --root ... --steps 20
    # a directory that AutoModelForCausalLM.from_pretrained loads:
    zccctl export /tmp/zcc/ckpt/hf-llama/step-00000020 /tmp/zcc/hf-model
    zccctl export /tmp/zcc/ckpt/hf-llama/step-00000020 /tmp/zcc/hf-ema --what ema

The model is a small Llama built from a config (no download; --hidden and
--layers size it, 2 layers of 64 by default); its config.json
is stored with the job, so that the export is loadable as it is. The data is
synthetic: seeded counting sequences per data-parallel rank and step, so
that a resumed run sees the batches the uninterrupted one would.
Under torchrun (gloo on the CPU, NCCL on GPUs) every decoder layer and then
the model are sharded with fully_shard over all ranks.

Prints "step=N loss=<float.hex()>" per step on rank 0. --pause-after N stops
after step N is snapshotted and waits to be killed (tests; --pause-dir says
where each rank writes its pid then); --dump-params DIR
writes the full parameters after every step (rank 0; tests compute the EMA
from them); --dump-final FILE writes the full model state at the end.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", default="hf-llama", help="zcc job id")
    p.add_argument("--socket", default=os.environ.get("ZCC_SOCKET", ""), help="zccd's socket")
    p.add_argument("--root", default=os.environ.get("ZCC_ROOT", ""), help="checkpoint root")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-every", type=int, default=1, help="persist every N-th step")
    p.add_argument("--ema-decay", type=float, default=0.99)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    p.add_argument("--seq", type=int, default=32, help="tokens per sequence")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hidden", type=int, default=64, help="hidden size (a multiple of 4)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers")
    p.add_argument("--pause-after", type=int, default=0)
    p.add_argument("--pause-dir", default="", help="with --pause-after: each rank writes "
                   "its pid to DIR/rank<R>.pid once paused")
    p.add_argument("--dump-params", default="")
    p.add_argument("--dump-final", default="")
    return p.parse_args(argv)


def llama_config(hidden, layers):
    """A small Llama: vocabulary 256, 4 attention heads (2 key/value heads)."""
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, tie_word_embeddings=False)


def full_parameters(model):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))
    return {k: v.contiguous() for k, v in state.items()}


def batch(step, dp_rank, args):
    """Counting sequences (start + stride * t, mod 256): learnable, so the
    loss falls."""
    g = torch.Generator().manual_seed(7919 * step + dp_rank)
    start = torch.randint(0, 256, (args.batch, 1), generator=g)
    stride = torch.randint(1, 4, (args.batch, 1), generator=g)
    return (start + stride * torch.arange(args.seq)) % 256


def main(argv):
    args = parse_args(argv)
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from zcc.torch import Checkpointer

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)

    config = llama_config(args.hidden, args.layers)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(device)
    if distributed:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh(device.type, (world,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    data = {"sequences_seen": 0}

    started = time.monotonic()
    ckpt = Checkpointer(model, optimizer, job_id=args.job, socket=args.socket, root=args.root,
                        save_every=args.save_every, ema_decay=args.ema_decay, user_state=data,
                        backpressure="block")
    if rank == 0:
        # Stored with the job: `zccctl export` copies it next to the weights.
        ckpt.put_job_file("config.json", config.to_json_string().encode())
    built = time.monotonic()
    restored = ckpt.restore()
    done = time.monotonic()
    if rank == 0:
        if restored is None:
            print("no checkpoint of job %s: starting fresh (%d ranks)" % (args.job, world))
        else:
            print("restored step %d from %s on %d ranks: Checkpointer %.3f s, restore %.3f s"
                  % (restored, ckpt.restored_from, world, built - started, done - built))
        sys.stdout.flush()

    model.train()
    for step in range((restored or 0) + 1, args.steps + 1):
        ids = batch(step, rank, args).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        data["sequences_seen"] += args.batch * world
        ckpt.step(step)
        if rank == 0:
            print("step=%d loss=%s" % (step, loss.item().hex()))
        if args.dump_params:
            params = full_parameters(model)
            if rank == 0:
                os.makedirs(args.dump_params, exist_ok=True)
                save_file(params, os.path.join(args.dump_params, "step-%d.safetensors" % step))
        if step == args.pause_after:
            ckpt.flush()
            if args.pause_dir:
                tmp = os.path.join(args.pause_dir, ".rank%d.pid" % rank)
                with open(tmp, "w") as f:
                    f.write(str(os.getpid()))
                os.rename(tmp, os.path.join(args.pause_dir, "rank%d.pid" % rank))
            print("paused", flush=True)
            while True:
                time.sleep(60)
    ckpt.flush()
    if args.dump_final:
        params = full_parameters(model)
        if rank == 0:
            save_file(params, args.dump_final)
    if rank == 0:
        print("trained to step %d; sequences seen %d" % (args.steps, data["sequences_seen"]))
    ckpt.close()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
