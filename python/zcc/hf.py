"""zcc.hf: zcc for Hugging Face's transformers.Trainer, as one callback.

    from zcc.hf import ZccCallback

    args = TrainingArguments(output_dir="out", save_strategy="no", ...)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[ZccCallback(job_id="llama", save_every=100)])
    trainer.train(resume_from_checkpoint=True)   # or False on the first run

The callback snapshots the model, the optimizer, the LR schedule, the
random generators and, under fp16, the loss scaler into zccd after every optimizer step (microseconds on the
training thread) and has zccd persist every ``save_every``-th step. The
Trainer's own checkpoints are not needed (``save_strategy="no"``).

Resuming goes through the Trainer's usual flow. For every step zccd has
committed, the callback writes ``<output_dir>/checkpoint-<step>/`` as the
Trainer expects it, without the weights and optimizer state, which zccd
holds: ``trainer_state.json`` (step, epoch, log history: the Trainer skips
the batches already trained on from it), ``rng_state.pth`` (the Trainer puts
the generators back after skipping), a ``model.safetensors.index.json``
that maps every weight to an empty file, and ``zcc.json`` (job and step).
``trainer.train(resume_from_checkpoint=True)`` picks the newest such folder;
at the start of training the callback restores that step from zccd (its
memory when it still holds it, else disk), model, optimizer, schedule and
generators, checked piece by piece. A folder whose step zccd cannot restore
is an error naming it, raised before anything trains; a folder the Trainer
wrote itself (training without zcc before) it loads as always, and zcc
goes on from that state. Folders beyond the
newest ``keep_folders`` are removed (zccd's own retention keeps the steps).

A folder is written by the main process (rank 0) once zccd reports its step
committed, with the generator files every rank wrote for that step before
its snapshot: a crash before that resumes from the folder before. The Trainer's DeepSpeed and FSDP paths load checkpoints their own
way and are not supported here; DDP and single-process training are.
"""

import json
import os

import torch
from transformers import TrainerCallback

from zcc._grad_scaler import add_grad_scaler
from zcc._trainer_callback import TrainerCallbackBase
from zcc.torch import Checkpointer

__all__ = ["ZccCallback"]

_PLACEHOLDER = "zcc-weights-in-zccd.safetensors"


class ZccCallback(TrainerCallbackBase, TrainerCallback):
    """A transformers.TrainerCallback that checkpoints with zcc.

    Args:
      job_id: the zcc job.
      save_every: persist every N-th optimizer step (default: the Trainer's
        ``save_steps``).
      keep_folders: resume folders kept in output_dir (default 2).
      commit_wait: at the end of training, how long to wait for zccd to
        commit the last saved step before writing its folder (seconds).
      Every other keyword goes to zcc.torch.Checkpointer (ema_decay, socket,
      root, keep_last, ...).
    """

    def _refuse(self, args):
        if getattr(args, "deepspeed", None) or getattr(args, "fsdp", None):
            raise ValueError("ZccCallback: the Trainer's DeepSpeed and FSDP paths load "
                             "checkpoints their own way; ZccCallback supports DDP and "
                             "single-process training (for FSDP2, use zcc.torch.Checkpointer in "
                             "your own loop)")

    def _make_checkpointer(self, model, optimizer, lr_scheduler, args, kwargs):
        # Under fp16 the Trainer's AcceleratedOptimizer holds the loss scaler,
        # which zcc keeps (the Trainer would look for scaler.pt).
        state = add_grad_scaler(dict(kwargs.pop("state", None) or {}),
                                getattr(optimizer, "scaler", None))
        return Checkpointer(model, getattr(optimizer, "optimizer", optimizer),
                            job_id=self.job_id, save_every=self._save_every,
                            scheduler=getattr(lr_scheduler, "scheduler", lr_scheduler),
                            state=state, **kwargs)

    @staticmethod
    def _rng_states(args):
        """The generators as the Trainer saves them (and loads them: every
        CUDA device's under DDP, the current one's otherwise)."""
        import random

        import numpy as np
        from transformers.training_args import ParallelMode
        states = {"python": random.getstate(), "numpy": np.random.get_state(),
                  "cpu": torch.random.get_rng_state()}
        if torch.cuda.is_available():
            states["cuda"] = torch.cuda.random.get_rng_state_all() \
                if args.parallel_mode == ParallelMode.DISTRIBUTED else \
                torch.cuda.random.get_rng_state()
        return states

    def _write_step_files(self, args, step, where, lr_scheduler):
        """This rank's generators, named as the Trainer looks for them."""
        name = "rng_state.pth" if args.world_size <= 1 else "rng_state_%d.pth" % args.process_index
        tmp = os.path.join(where, "." + name)
        torch.save(self._rng_states(args), tmp)
        os.replace(tmp, os.path.join(where, name))

    def _write_placeholders(self, folder, step):
        # The Trainer loads weights from an index before training starts;
        # this one maps every weight to an empty file, and the callback fills
        # the model from zccd right after.
        from safetensors.torch import save_file
        save_file({}, os.path.join(folder, _PLACEHOLDER))
        weight_map = {k: _PLACEHOLDER for k in self.ckpt.model.state_dict()}
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"zcc_job": self.job_id, "zcc_step": step},
                       "weight_map": weight_map}, f)
