"""Trains a tiny PaddleFormers Llama (built from a config, no download) with
PaddleFormers' Trainer on the CPU, checkpointed by zcc.paddleformers.ZccCallback.

    python3 train_paddleformers.py --socket /tmp/zcc-example/zccd.sock \\
        --root /tmp/zcc-example/ckpt --out /tmp/zcc-example/pf-out --steps 30

Run again with the same arguments and it resumes through the Trainer's own
flow (``trainer.train(resume_from_checkpoint=get_last_checkpoint(out))``)
from the newest step zccd committed: the Trainer skips the batches already trained on, zcc brings
back the model, AdamW, the schedule and the generators. Each optimizer step
prints "step=N loss=<float.hex()>" (the exact loss); --dump FILE.npz writes
the final weights. Under paddle.distributed.launch its ranks train data
parallel (gloo on the CPU). The job's config.json is stored with it, so

    zccctl export /tmp/zcc-example/ckpt/pf-llama/latest /tmp/zcc-example/pf-model

writes a folder that ``LlamaForCausalLM.from_pretrained(folder)`` loads.
"""

import os
import sys
import warnings

import numpy as np

import integration_common


def parse_args(argv):
    p = integration_common.parser(__doc__.split("\n")[0], "pf-llama")
    p.add_argument("--out", required=True, help="the Trainer's output_dir")
    p.add_argument("--dump", default="", help="write the final weights here (.npz)")
    return p.parse_args(argv)


def tiny_llama():
    """A two-layer Llama; fuse_rms_norm off (its fused kernel is GPU-only)."""
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        fuse_rms_norm=False))


def main(argv):
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    import paddle
    from paddleformers.trainer import (Trainer, TrainerCallback, TrainingArguments,
                                       get_last_checkpoint, set_seed)

    paddle.set_device("cpu")

    class ExactLoss(Trainer):
        """Prints each step's loss exactly (one micro-batch per step here)."""

        def compute_loss(self, model, inputs, *a, **k):
            loss = super().compute_loss(model, inputs, *a, **k)
            value = loss[0] if isinstance(loss, tuple) else loss
            print("step=%d loss=%s" % (self.state.global_step + 1, float(value).hex()),
                  flush=True)
            return loss

    set_seed(0)
    model = tiny_llama()
    rows = np.random.RandomState(1).randint(0, 256, (400, 17))
    data = [{"input_ids": r[:-1].tolist(), "labels": r[1:].tolist()} for r in rows]
    training = TrainingArguments(output_dir=args.out, max_steps=args.steps,
                                 per_device_train_batch_size=8, learning_rate=3e-3,
                                 lr_scheduler_type="linear", warmup_steps=3, save_strategy="no",
                                 logging_steps=1000, report_to=[], seed=0,
                                 dataloader_num_workers=0, disable_tqdm=True,
                                 amp_master_grad=False,
                                 # Data parallel over the ranks (PaddleFormers'
                                 # default with several is sharding stage 1).
                                 sharding="")
    from zcc.paddleformers import ZccCallback
    callbacks, _ = integration_common.trainer_callbacks(args, ZccCallback, TrainerCallback)
    trainer = ExactLoss(model=model, args=training, train_dataset=data, callbacks=callbacks)
    last = None if args.no_zcc or not os.path.isdir(args.out) else get_last_checkpoint(args.out)
    print("resume=%s" % (last is not None), flush=True)
    trainer.train(resume_from_checkpoint=last)
    if args.dump:
        np.savez(args.dump, **{k: v.numpy() for k, v in model.state_dict().items()})
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
