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
``DataLoaderConfiguration(use_stateful_dataloader=True)``). Everything else is
zcc.torch's: see its docstring and python/README.md.
"""

import zcc.torch

__all__ = ["Checkpointer"]


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
        objects["dataloader"] = dataloader
    kwargs.setdefault("rank", accelerator.process_index)
    kwargs.setdefault("world_size", accelerator.num_processes)
    return zcc.torch.Checkpointer(
        accelerator.unwrap_model(model),
        getattr(optimizer, "optimizer", optimizer),  # AcceleratedOptimizer's own
        job_id=job_id, scheduler=getattr(scheduler, "scheduler", scheduler), state=objects,
        **kwargs)
