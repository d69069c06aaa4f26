"""zcc.hf: zcc for Hugging Face's transformers.Trainer, as one callback.

    from zcc.hf import ZccCallback

    args = TrainingArguments(output_dir="out", save_strategy="no", ...)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[ZccCallback(job_id="llama", save_every=100)])
    trainer.train(resume_from_checkpoint=True)   # or False on the first run

The callback snapshots the model, the optimizer, the LR schedule and the
random generators into zccd after every optimizer step (microseconds on the
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
is an error naming it, raised before anything trains. Folders beyond the
newest ``keep_folders`` are removed (zccd's own retention keeps the steps).

A folder is written by the main process (rank 0) once zccd reports its step
committed, with the generator files every rank wrote for that step before
its snapshot: a crash before that resumes from the folder before. The Trainer's DeepSpeed and FSDP paths load checkpoints their own
way and are not supported here; DDP and single-process training are.
"""

import dataclasses
import json
import os
import shutil
import time
import warnings

import torch
from transformers import TrainerCallback

from zcc.torch import Checkpointer

__all__ = ["ZccCallback"]

_MARKER = "zcc.json"
_PLACEHOLDER = "zcc-weights-in-zccd.safetensors"


class ZccCallback(TrainerCallback):
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

    def __init__(self, job_id, save_every=None, keep_folders=2, commit_wait=60.0,
                 **checkpointer_kwargs):
        self.job_id = job_id
        self.save_every = save_every
        self.keep_folders = max(1, keep_folders)
        self.commit_wait = commit_wait
        self.checkpointer_kwargs = checkpointer_kwargs
        self.ckpt = None
        self._pending = []  # rank 0: (step, trainer_state_json) awaiting commit
        self._last_check = 0.0
        self._status_error = None  # the last failed status query's reason

    # ------------------------------------------------------------------ events

    def on_train_begin(self, args, state, control, model=None, optimizer=None,
                       lr_scheduler=None, **kwargs):
        if self.ckpt is not None:
            return
        if optimizer is None:
            raise ValueError("ZccCallback: the Trainer passed no optimizer")
        if getattr(args, "deepspeed", None) or getattr(args, "fsdp", None):
            raise ValueError("ZccCallback: the Trainer's DeepSpeed and FSDP paths load "
                             "checkpoints their own way; ZccCallback supports DDP and "
                             "single-process training (for FSDP2, use zcc.torch.Checkpointer in "
                             "your own loop)")
        if str(getattr(args, "save_strategy", "no")).split(".")[-1].lower() != "no":
            warnings.warn("ZccCallback: the Trainer writes checkpoints of its own too "
                          "(save_strategy=%s); pass save_strategy=\"no\" to leave them to zcc"
                          % args.save_strategy)
        every = self.save_every or (args.save_steps if args.save_steps and args.save_steps >= 1
                                    else 0)
        self._save_every = int(every)
        resuming = state.global_step > 0
        kwargs_ = dict(self.checkpointer_kwargs)
        kwargs_.setdefault("rank", args.process_index)
        kwargs_.setdefault("world_size", args.world_size)
        kwargs_.setdefault("prefetch_restore", resuming)
        self.ckpt = Checkpointer(model, getattr(optimizer, "optimizer", optimizer),
                                 job_id=self.job_id, save_every=self._save_every,
                                 scheduler=getattr(lr_scheduler, "scheduler", lr_scheduler),
                                 **kwargs_)
        if resuming:
            # The Trainer read trainer_state.json of the folder it resumes
            # from: that step, exactly.
            try:
                got = self.ckpt.restore(step=state.global_step)
            except Exception as e:
                raise RuntimeError(
                    "ZccCallback: the Trainer resumes from step %d, which zcc job '%s' cannot "
                    "restore (%s); resume from an older checkpoint-<step> folder"
                    % (state.global_step, self.job_id, e)) from e
            if got != state.global_step:
                raise RuntimeError(
                    "ZccCallback: the Trainer resumes from step %d, which zcc job '%s' cannot "
                    "restore (%s); resume from an older checkpoint-<step> folder"
                    % (state.global_step, self.job_id,
                       "zccd has no such step" if got is None else "it restored %s" % got))

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if self._save_every and step % self._save_every == 0:
            # Every rank's generators, as this step's snapshot takes them,
            # written before the snapshot: once zccd has committed the step
            # (which needs every rank's snapshot) every rank's file is there.
            self._write_rng(args, step)
            if args.process_index == 0:
                self._pending.append((step, self._trainer_state_json(state)))
        self.ckpt.step(step)
        if self._pending and time.monotonic() - self._last_check >= 1.0:
            self._write_committed(args)

    def on_train_end(self, args, state, control, **kwargs):
        if self.ckpt is None:
            return
        self.flush(args, self.commit_wait)
        self.ckpt.close()
        self.ckpt = None

    def flush(self, args, timeout=60.0):
        """Hands every snapshot taken so far to zccd, then waits up to
        `timeout` seconds for the saved steps to be committed and writes
        their folders. Returns the steps still not committed."""
        self.ckpt.flush(timeout)
        deadline = time.monotonic() + timeout
        while True:
            self._write_committed(args)
            if not self._pending or time.monotonic() >= deadline:
                return [p[0] for p in self._pending]
            time.sleep(0.05)

    # ----------------------------------------------------------------- folders

    @staticmethod
    def _trainer_state_json(state):
        """trainer_state.json as TrainerState.save_to_json writes it."""
        return json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True) + "\n"

    @staticmethod
    def _rng_states():
        import random

        import numpy as np
        states = {"python": random.getstate(), "numpy": np.random.get_state(),
                  "cpu": torch.random.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states["cuda"] = torch.cuda.random.get_rng_state()
        return states

    def _write_committed(self, args):
        self._last_check = time.monotonic()
        try:
            committed = self.ckpt.client.checkpoint_status()["last_committed_step"]
        except Exception as e:  # zccd away: tried again later, said once per reason
            if str(e) != self._status_error:
                self._status_error = str(e)
                warnings.warn("ZccCallback: cannot ask zccd which steps are committed (%s); "
                              "their checkpoint folders wait" % e)
            return
        self._status_error = None
        ready = [p for p in self._pending if p[0] <= committed]
        self._pending = [p for p in self._pending if p[0] > committed]
        for step, trainer_state in ready:
            self._write_folder(args, step, trainer_state)
        if ready:
            self._prune(args)

    @staticmethod
    def _rng_dir(args, step):
        return os.path.join(args.output_dir, ".zcc-rng-%d" % step)

    def _write_rng(self, args, step):
        """This rank's generators for step `step`'s folder, named as the
        Trainer looks for them."""
        where = self._rng_dir(args, step)
        os.makedirs(where, exist_ok=True)
        name = "rng_state.pth" if args.world_size <= 1 else "rng_state_%d.pth" % args.process_index
        tmp = os.path.join(where, "." + name)
        torch.save(self._rng_states(), tmp)
        os.replace(tmp, os.path.join(where, name))

    def _write_folder(self, args, step, trainer_state):
        final = os.path.join(args.output_dir, "checkpoint-%d" % step)
        tmp = os.path.join(args.output_dir, ".zcc-checkpoint-%d.tmp" % step)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        with open(os.path.join(tmp, "trainer_state.json"), "w") as f:
            f.write(trainer_state)
        rng_dir = self._rng_dir(args, step)
        for name in os.listdir(rng_dir) if os.path.isdir(rng_dir) else []:
            if name.startswith("rng_state"):
                os.replace(os.path.join(rng_dir, name), os.path.join(tmp, name))
        shutil.rmtree(rng_dir, ignore_errors=True)
        # The Trainer loads weights from an index before training starts;
        # this one maps every weight to an empty file, and the callback fills
        # the model from zccd right after.
        from safetensors.torch import save_file
        save_file({}, os.path.join(tmp, _PLACEHOLDER))
        weight_map = {k: _PLACEHOLDER for k in self.ckpt.model.state_dict()}
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"zcc_job": self.job_id, "zcc_step": step},
                       "weight_map": weight_map}, f)
        with open(os.path.join(tmp, _MARKER), "w") as f:
            json.dump({"job_id": self.job_id, "step": step}, f)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)

    def _prune(self, args):
        ours = []
        for name in os.listdir(args.output_dir):
            path = os.path.join(args.output_dir, name)
            if name.startswith("checkpoint-") and os.path.isfile(os.path.join(path, _MARKER)):
                try:
                    ours.append((int(name.split("-", 1)[1]), path))
                except ValueError:
                    continue
        for _, path in sorted(ours)[:-self.keep_folders]:
            shutil.rmtree(path, ignore_errors=True)
        # Generators of saved steps that never got a folder (their commit
        # failed): those older than the newest folder.
        newest = max((step for step, _ in ours), default=-1)
        for name in os.listdir(args.output_dir):
            if name.startswith(".zcc-rng-"):
                try:
                    step = int(name[len(".zcc-rng-"):])
                except ValueError:
                    continue
                if step < newest:
                    shutil.rmtree(os.path.join(args.output_dir, name), ignore_errors=True)
