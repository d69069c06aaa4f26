"""Trains a tiny Hugging Face Llama (built from a config, no download) with
transformers.Trainer on the CPU, checkpointed by zcc.hf.ZccCallback.

    python3 train_hf_trainer.py --socket /tmp/zcc-example/zccd.sock \\
        --root /tmp/zcc-example/ckpt --out /tmp/zcc-example/hf-out --steps 30

Run again with the same arguments and it resumes through the Trainer's own
flow (``trainer.train(resume_from_checkpoint=True)``) from the newest step
zccd committed: the Trainer skips the batches already trained on, zcc brings
back the model, AdamW, the schedule and the generators. Each optimizer step
prints "step=N loss=<float.hex()>" (the exact loss, not the rounded one the
Trainer logs); --dump FILE writes the final weights.
"""

import os
import sys
import warnings

import torch

import integration_common


def parse_args(argv):
    p = integration_common.parser(__doc__.split("\n")[0], "hf-trainer")
    p.add_argument("--out", required=True, help="the Trainer's output_dir")
    p.add_argument("--dump", default="", help="write the final weights here (safetensors)")
    p.add_argument("--trainer-save-every", type=int, default=0,
                   help="the Trainer's own checkpoints every N steps (default: none)")
    p.add_argument("--trainer-resume", action="store_true",
                   help="resume from the newest checkpoint folder even with --no-zcc")
    return p.parse_args(argv)


class Sequences(torch.utils.data.Dataset):
    def __init__(self):
        self.tokens = torch.randint(0, 256, (400, 17), generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i, :-1], "labels": self.tokens[i, 1:]}


def main(argv):
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_utils import set_seed

    class ExactLoss(Trainer):
        """Prints each micro-batch's loss exactly (one per step here)."""

        def compute_loss(self, model, inputs, *a, **k):
            loss = super().compute_loss(model, inputs, *a, **k)
            value = loss[0] if isinstance(loss, tuple) else loss
            print("step=%d loss=%s" % (self.state.global_step + 1, value.item().hex()), flush=True)
            return loss

    set_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))  # under torchrun: DDP over gloo
    model = integration_common.tiny_llama()
    training = TrainingArguments(output_dir=args.out, max_steps=args.steps,
                                 per_device_train_batch_size=8, learning_rate=3e-3,
                                 lr_scheduler_type="linear", warmup_steps=3,
                                 save_strategy="steps" if args.trainer_save_every else "no",
                                 save_steps=args.trainer_save_every or 500,
                                 logging_steps=1000, report_to=[], use_cpu=True, seed=0,
                                 dataloader_num_workers=0, disable_tqdm=True,
                                 ddp_backend="gloo" if world > 1 else None)
    from zcc.hf import ZccCallback
    callbacks, _ = integration_common.trainer_callbacks(args, ZccCallback, TrainerCallback)
    trainer = ExactLoss(model=model, args=training, train_dataset=Sequences(), callbacks=callbacks)
    resume = (not args.no_zcc or args.trainer_resume) and any(n.startswith("checkpoint-") for n in
                                     (os.listdir(args.out) if os.path.isdir(args.out) else []))
    print("resume=%s" % resume, flush=True)
    trainer.train(resume_from_checkpoint=True if resume else None)
    if args.dump and trainer.is_world_process_zero():
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
                  args.dump)
    integration_common.finish()
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
