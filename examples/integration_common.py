"""What the integration examples (train_accelerate.py, train_hf_trainer.py,
train_lightning.py) share: their command line, and the tiny Llama they
train, built from a config (no download)."""

import argparse
import os


def parser(description, job):
    """The examples' common flags; each adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--job", default=job, help="zcc job id")
    p.add_argument("--socket", default=os.environ.get("ZCC_SOCKET", ""), help="zccd socket")
    p.add_argument("--root", default=os.environ.get("ZCC_ROOT", ""), help="checkpoint root")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--no-zcc", action="store_true", help="train without checkpointing")
    p.add_argument("--pause-after", type=int, default=0,
                   help="after this step: flush, print 'paused', and wait to be killed")
    return p


def trainer_callbacks(args, zcc_callback_class, callback_base):
    """The Trainer examples' callbacks (transformers' or PaddleFormers'):
    zcc's (unless --no-zcc) and, with --pause-after N, one that flushes
    zcc after step N, prints "paused", and waits to be killed. Returns
    (callbacks, zcc's callback or None)."""
    import signal

    callbacks = []
    zcc_callback = None
    if not args.no_zcc:
        zcc_callback = zcc_callback_class(job_id=args.job, save_every=args.save_every,
                                          socket=args.socket, root=args.root,
                                          backpressure="block")
        callbacks.append(zcc_callback)

    class Pause(callback_base):
        def on_step_end(self, a, state, control, **kwargs):
            if state.global_step == args.pause_after:
                left = zcc_callback.flush(a)
                print("paused (steps not committed: %s)" % left, flush=True)
                while True:
                    signal.pause()  # the test kills this process here

    if args.pause_after:
        callbacks.append(Pause())
    return callbacks, zcc_callback


def tiny_llama():
    """A two-layer Llama with attention dropout (the random generators matter)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attention_dropout=0.1))


def finish():
    """Tears the default process group down before the interpreter exits.

    Left to interpreter exit, gloo's threads can be destroyed while still
    joinable and abort the process ('terminate called without an active
    exception') after a run that otherwise succeeded."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
