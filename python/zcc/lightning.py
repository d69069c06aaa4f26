"""zcc.lightning: zcc for PyTorch Lightning, as one callback.

    from zcc.lightning import ZccCallback

    trainer = lightning.pytorch.Trainer(max_steps=10_000, enable_checkpointing=False,
                                        callbacks=[ZccCallback(job_id="run", save_every=100)])
    trainer.fit(model)          # the same line resumes: from the newest zcc step

After every optimizer step the callback snapshots the LightningModule's
parameters and buffers, its optimizer, its LR scheduler, the random
generators, Lightning's fit loop (epoch, step and batch counters, and the
state of a stateful training data loader, such as torchdata's
StatefulDataLoader: the loop keeps it) and, under "16-mixed", the loss scaler
into zccd, which persists every
``save_every``-th step. When the fit starts, the callback restores the newest
step zccd can serve (its memory of a trainer that died, else disk): the
module, the optimizer and schedule, the generators and the loop, so training
goes on at the next batch as if it had not stopped. Lightning's own
checkpoints are not needed (``enable_checkpointing=False``); ``resume=False``
starts afresh.

One optimizer and at most one scheduler (``configure_optimizers``' usual
return); the module's parameters are registered as zcc.torch registers a
model's (plain, DDP replicas, or FSDP2 DTensors), with rank and world size
from the Trainer. Give the training data loader a generator of its own
(``generator=torch.Generator().manual_seed(...)``): a resumed epoch iterator
is made at another step than the interrupted one, and one drawing from
torch's generator would shift every later random draw.
"""

import lightning.pytorch as pl

from zcc._grad_scaler import add_grad_scaler
from zcc.torch import Checkpointer

__all__ = ["ZccCallback"]


class _FitLoop:
    """Lightning's fit loop as a Stateful: its counters and its loader state."""

    def __init__(self, trainer):
        self.trainer = trainer

    def state_dict(self):
        return self.trainer.fit_loop.state_dict()

    def load_state_dict(self, state):
        self.trainer.fit_loop.load_state_dict(state)


class ZccCallback(pl.Callback):
    """A Lightning callback that checkpoints with zcc.

    Args:
      job_id: the zcc job.
      save_every: persist every N-th optimizer step (0: only on save_now()).
      resume: restore the newest step when the fit starts (default True).
      Every other keyword goes to zcc.torch.Checkpointer (ema_decay, socket,
      root, keep_last, backpressure, ...).
    """

    def __init__(self, job_id, save_every=0, resume=True, **checkpointer_kwargs):
        self.job_id = job_id
        self.save_every = save_every
        self.resume = resume
        self.checkpointer_kwargs = checkpointer_kwargs
        self.ckpt = None
        self.restored_step = None  # after the fit starts: the step restored, or None
        self.restored_from = None  # "memory" or "disk"
        self._last_step = None

    def on_fit_start(self, trainer, pl_module):
        optimizers = trainer.optimizers
        if len(optimizers) != 1:
            raise ValueError("ZccCallback checkpoints one optimizer; the module configured %d"
                             % len(optimizers))
        configs = trainer.lr_scheduler_configs
        if len(configs) > 1:
            raise ValueError("ZccCallback checkpoints at most one LR scheduler; the module "
                             "configured %d" % len(configs))
        kwargs = dict(self.checkpointer_kwargs)
        kwargs.setdefault("rank", trainer.global_rank)
        kwargs.setdefault("world_size", trainer.world_size)
        kwargs.setdefault("prefetch_restore", self.resume)
        state = dict(kwargs.pop("state", None) or {})
        state["lightning_fit_loop"] = _FitLoop(trainer)
        # ("16-mixed": the precision plugin's; Lightning's own checkpoints keep it.)
        add_grad_scaler(state, getattr(trainer.precision_plugin, "scaler", None))
        self.ckpt = Checkpointer(pl_module, optimizers[0], job_id=self.job_id,
                                 save_every=self.save_every,
                                 scheduler=configs[0].scheduler if configs else None,
                                 state=state, **kwargs)
        if self.resume:
            # Where Lightning restores a checkpoint's loops: before the fit
            # loop runs, which then resumes its loader at the next batch.
            self.restored_step = self.ckpt.restore()
            self.restored_from = self.ckpt.restored_from
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == self._last_step:
            return  # gradients still accumulating: no optimizer step yet
        self._last_step = step
        self.ckpt.step(step)

    def save_now(self):
        """Persist the newest snapshot (zcc.torch.Checkpointer.save_now)."""
        self.ckpt.save_now()

    def flush(self, timeout=60.0):
        self.ckpt.flush(timeout)

    def on_fit_end(self, trainer, pl_module):
        if self.ckpt is not None:
            self.ckpt.flush()
            self.ckpt.close()
            self.ckpt = None
