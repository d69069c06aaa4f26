"""zcc.accelerate: zcc for a training loop run by Hugging Face Accelerate.

    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    import zcc.accelerate

    accelerator = Accelerator(
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader,
                                                              scheduler)
    ckpt = zcc.accelerate.Checkpointer(accelerator, model, optimizer, job_id="run",
                                       save_every=100, scheduler=scheduler,
                                       dataloader=loader)
    start = (ckpt.restore() or 0) + 1     # the loader goes on at the next batch
    for step, batch in enumerate(loader, start):
        accelerator.backward(model(**batch).loss)
        optimizer.step(); scheduler.step(); optimizer.zero_grad()
        ckpt.step(step)

In place of ``accelerator.save_state``/``load_state``: a zcc.torch.Checkpointer
for the objects ``accelerator.prepare`` returned. It registers the model and
optimizer Accelerate wraps (``unwrap_model``, the AcceleratedOptimizer's and
AcceleratedScheduler's own), takes rank and world size from the accelerator,
and checkpoints the prepared data loader as ``state`` (it must be stateful:
``DataLoaderConfiguration(use_stateful_dataloader=True)``), with the epoch it
is in (which seeds ``use_seedable_sampler``'s shuffle, and which the loader's
own state leaves out), and the accelerator's loss scaler under fp16. Everything
else is zcc.torch's: see its docstring and python/README.md.
"""

import zcc.torch
from zcc._grad_scaler import add_grad_scaler

__all__ = ["Checkpointer"]

_LOADER_KEY = "zcc_accelerate_loader"  # (a state without it: the loader's own, as saved before)


class _PreparedLoader:
    """A loader ``accelerator.prepare`` made, as a Stateful: its own state and
    its epoch (``iteration``: each new iterator seeds a seedable sampler with
    it; a run resumed without it would shuffle every later epoch as the
    first)."""

    def __init__(self, loader):
        self.loader = loader

    def state_dict(self):
        state = {_LOADER_KEY: 1, "loader": self.loader.state_dict()}
        epoch = getattr(self.loader, "iteration", None)
        if epoch is not None:
            # Past its epoch's last batch the loader counts the next epoch
            # only once that iterator ends; a resumed one, whose iterator
            # ends at once, would begin the same epoch again.
            if getattr(self.loader, "end_of_dataloader", False):
                epoch += 1
            state["epoch"] = epoch
        return state

    def load_state_dict(self, state):
        if not isinstance(state, dict) or _LOADER_KEY not in state:
            self.loader.load_state_dict(state)
            return
        if "epoch" in state and hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(state["epoch"])
        self.loader.load_state_dict(state["loader"])


def Checkpointer(accelerator, model, optimizer=None, *, job_id, scheduler=None, dataloader=None,
                 state=None, **kwargs):
    """A zcc.torch.Checkpointer of what ``accelerator.prepare`` returned.

    Args:
      accelerator: the ``accelerate.Accelerator``.
      model, optimizer, scheduler: as prepared (or not) by it.
      dataloader: the prepared training data loader, checkpointed at every
        step (None: not checkpointed).
      state: more objects with ``state_dict()``/``load_state_dict()``.
      job_id and every other keyword: zcc.torch.Checkpointer's.
    """
    objects = dict(state or {})
    if dataloader is not None:
        if not callable(getattr(dataloader, "state_dict", None)):
            raise ValueError(
                "the data loader (%s) keeps no state: create the Accelerator with "
                "dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True), or pass "
                "dataloader=None" % type(dataloader).__name__)
        if "dataloader" in objects:
            raise ValueError("state already has a 'dataloader'")
        objects["dataloader"] = _PreparedLoader(dataloader)
    add_grad_scaler(objects, getattr(accelerator, "scaler", None))
    kwargs.setdefault("rank", accelerator.process_index)
    kwargs.setdefault("world_size", accelerator.num_processes)
    return zcc.torch.Checkpointer(
        accelerator.unwrap_model(model),
        getattr(optimizer, "optimizer", optimizer),  # AcceleratedOptimizer's own
        job_id=job_id, scheduler=getattr(scheduler, "scheduler", scheduler), state=objects,
        **kwargs)
