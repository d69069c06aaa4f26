"""Trains a tiny Hugging Face Llama (built from a config, no download) with
PyTorch Lightning on the CPU, checkpointed by zcc.lightning.ZccCallback.

    python3 train_lightning.py --socket /tmp/zcc-example/zccd.sock \\
        --root /tmp/zcc-example/ckpt --steps 30

Run again with the same arguments and ``trainer.fit`` resumes from the newest
step zccd holds: the module, AdamW, the schedule, the generators and
Lightning's loop with its StatefulDataLoader, so that every step after the
resume has the loss the uninterrupted run had. Each optimizer step prints
"step=N loss=<float.hex()>".
"""

import signal
import sys
import warnings

import torch

import integration_common


def parse_args(argv):
    return integration_common.parser(__doc__.split("\n")[0], "lightning").parse_args(argv)


def main(argv):
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    import lightning.pytorch as pl
    from torchdata.stateful_dataloader import StatefulDataLoader

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.llama = integration_common.tiny_llama()

        def training_step(self, batch, batch_idx):
            loss = self.llama(input_ids=batch[:, :-1], labels=batch[:, 1:]).loss
            print("step=%d loss=%s" % (self.trainer.global_step + 1, loss.item().hex()), flush=True)
            return loss

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=3e-3)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 0.05 * s))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        def train_dataloader(self):
            # 400 sequences, 50 batches an epoch, shuffled by the loader's own
            # generator (its state goes with Lightning's loop).
            tokens = torch.randint(0, 256, (400, 17), generator=torch.Generator().manual_seed(1))
            return StatefulDataLoader(tokens, batch_size=8, shuffle=True,
                                      generator=torch.Generator().manual_seed(2))

    pl.seed_everything(0, verbose=False)
    module = Module()
    callbacks = []
    zcc_callback = None
    if not args.no_zcc:
        from zcc.lightning import ZccCallback
        zcc_callback = ZccCallback(job_id=args.job, save_every=args.save_every,
                                   socket=args.socket, root=args.root, backpressure="block")
        callbacks.append(zcc_callback)

    class Pause(pl.Callback):
        def on_train_batch_end(self, trainer, *a):
            if trainer.global_step == args.pause_after:
                zcc_callback.flush()
                print("paused", flush=True)
                while True:
                    signal.pause()  # the test kills this process here

    if args.pause_after:
        callbacks.append(Pause())
    trainer = pl.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True, callbacks=callbacks)
    trainer.fit(module)
    if zcc_callback is not None:
        print("restored=%s from=%s" % (zcc_callback.restored_step, zcc_callback.restored_from),
              flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
