"""zcc.paddleformers: zcc for PaddleFormers' Trainer, as one callback.

    from zcc.paddleformers import ZccCallback

    args = TrainingArguments(output_dir="out", save_strategy="no", ...)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[ZccCallback(job_id="llama", save_every=100)])
    trainer.train(resume_from_checkpoint=get_last_checkpoint(args.output_dir))

The callback snapshots the model, the optimizer (with its fp32 master
weights under ``multi_precision``), the LR schedule and the random
generators into zccd after every optimizer step (microseconds on the
training thread; zcc.paddle.Checkpointer) and has zccd persist every
``save_every``-th step. The Trainer's own checkpoints are not needed
(``save_strategy="no"``).

Resuming goes through the Trainer's usual flow. For every step zccd has
committed, the callback writes ``<output_dir>/checkpoint-<step>/`` as the
Trainer reads it, without the weights and optimizer state, which zccd holds:
``trainer_state.bin`` (step, epoch, log history: the Trainer skips the
batches already trained on from it), each rank's ``rng_state_<rank>.pth``
(the Trainer puts the generators back after skipping), ``scheduler.pdparams``
(the schedule at that step), and placeholders the Trainer loads before
training starts, an empty ``model_state.pdparams`` and an
``optimizer.pdopt`` holding only the schedule; then ``zcc.json`` (job and
step) and ``.checkpoint_done``. ``get_last_checkpoint(output_dir)``
(``paddleformers.trainer``) finds the newest such folder, None on the first
run (PaddleFormers 1.2's ``train(resume_from_checkpoint=True)`` does not
resolve ``True`` on every path: pass the folder). The callback sets
``load_checkpoint_format`` to the Trainer's plain layout, which its folders
use (the default, ``flex_checkpoint``, reads distributed checkpoints of its
own). At the start of training the callback restores
that step from zccd (its memory when it still holds it, else disk): model,
optimizer, schedule and generators, checked piece by piece. A folder whose
step zccd cannot restore is an error naming it, raised before anything
trains.

Single-process and data-parallel training are supported (data parallel
needs ``sharding=""`` in the TrainingArguments: with several ranks
PaddleFormers shards the optimizer by default). The Trainer's
hybrid parallelism (tensor, pipeline or sharding degrees above 1), its auto
parallel mode and its own zero-cost checkpointing
(``enable_zero_cost_checkpoint``) load checkpoints their own way and are
refused; for those, use zcc.paddle.Checkpointer in your own loop.

``zccctl export <root>/<job>/latest <dir>`` writes a folder that
``from_pretrained(dir)`` loads: the callback stores the model's
``config.json`` with the job (``put_job_file``; export copies it) and a
``zcc_export.json`` naming the weights PaddleFormers transposes when it
saves (the model class's ``transpose_weight_keys``: a Linear's weight, which
Paddle keeps as [in, out], is [out, in] in a Hugging Face checkpoint), which
export writes transposed. The checkpoint itself keeps Paddle's layout.
"""

import copy
import json
import os
import random
import re

import numpy as np
import paddle
from paddleformers.trainer import TrainerCallback

from zcc._trainer_callback import TrainerCallbackBase, is_zcc_folder, newest_checkpoint_folder
from zcc.paddle import Checkpointer

__all__ = ["ZccCallback"]

# The files PaddleFormers' Trainer reads from a checkpoint-<step> folder.
_TRAINER_STATE = "trainer_state.bin"
_WEIGHTS = "model_state.pdparams"
_OPTIMIZER = "optimizer.pdopt"
_SCHEDULER = "scheduler.pdparams"


def _variant(name, variant):
    """`name` with the Trainer's suffix for it (model_state.<v>.pdparams)."""
    if not variant:
        return name
    head, dot, ext = name.rpartition(".")
    return "%s.%s.%s" % (head, variant, ext)


def _transposed_on_save(model, params):
    """The names of `params` ({checkpoint key: parameter}) that PaddleFormers
    writes transposed into a Hugging Face checkpoint: 2-D weights whose key
    ends in ``.<k>.weight`` (or is ``<k>.weight``) for a <k> of the model
    class's ``transpose_weight_keys``, LoRA's aside (save_pretrained's rule)."""
    keys = getattr(type(model), "transpose_weight_keys", None) or []
    out = []
    for name, p in params.items():
        if "lora" in name or len(p.shape) != 2:
            continue
        if any(re.search(r"\.%s\.weight$" % k, name) or re.fullmatch(r"%s\.weight" % k, name)
               for k in keys):
            out.append(name)
    return sorted(out)


class ZccCallback(TrainerCallbackBase, TrainerCallback):
    """A paddleformers.trainer.TrainerCallback that checkpoints with zcc.

    Args:
      job_id: the zcc job.
      save_every: persist every N-th optimizer step (default: the Trainer's
        ``save_steps``).
      keep_folders: resume folders kept in output_dir (default 2).
      commit_wait: at the end of training, how long to wait for zccd to
        commit the last saved step before writing its folder (seconds).
      Every other keyword goes to zcc.paddle.Checkpointer (ema_decay, socket,
      root, keep_last, ...).
    """

    _args = None

    def on_init_end(self, args, state, control, **kwargs):
        # The folders are in the Trainer's plain layout (model_state.pdparams,
        # optimizer.pdopt), which it reads with load_checkpoint_format unset;
        # its default, "flex_checkpoint", would look for a distributed
        # checkpoint's metadata instead. Left alone when the newest folder
        # is one the Trainer wrote itself (training without zcc before).
        newest = newest_checkpoint_folder(args.output_dir)
        if getattr(args, "load_checkpoint_format", None) and \
                (newest is None or is_zcc_folder(newest)):
            args.load_checkpoint_format = ""

    def _refuse(self, args):
        why = []
        for degree in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                       "sharding_parallel_size"):
            if (getattr(args, degree, 1) or 1) > 1:
                why.append("%s=%s" % (degree, getattr(args, degree)))
        if getattr(args, "sharding", None) and getattr(args, "use_hybrid_parallel", False):
            why.append("sharding=%s" % (args.sharding,))
        for flag in ("enable_auto_parallel", "enable_zero_cost_checkpoint"):
            if getattr(args, flag, False):
                why.append(flag)
        if why:
            raise ValueError(
                "ZccCallback: the Trainer loads checkpoints of this training its own way (%s); "
                "ZccCallback supports single-process and data-parallel training (use "
                "zcc.paddle.Checkpointer in your own loop for the rest)" % ", ".join(why))

    def _make_checkpointer(self, model, optimizer, lr_scheduler, args, kwargs):
        self._args = args
        scheduler = lr_scheduler if isinstance(lr_scheduler, paddle.optimizer.lr.LRScheduler) \
            else None
        ckpt = Checkpointer(model, optimizer, job_id=self.job_id, save_every=self._save_every,
                            scheduler=scheduler, **kwargs)
        config = getattr(ckpt.model, "config", None)
        if args.process_index == 0 and config is not None and hasattr(config, "to_json_string"):
            # What `zccctl export` puts beside the weights, for from_pretrained.
            ckpt.put_job_file("config.json", config.to_json_string().encode())
            ckpt.put_job_file("zcc_export.json", json.dumps(
                {"transpose": _transposed_on_save(ckpt.model, ckpt._params)}).encode())
        return ckpt

    @staticmethod
    def _capture_state(state):
        return copy.deepcopy(state)

    @staticmethod
    def _write_trainer_state(folder, captured):
        paddle.save(captured, os.path.join(folder, _TRAINER_STATE))

    @staticmethod
    def _save(obj, where, name):
        tmp = os.path.join(where, "." + name)
        paddle.save(obj, tmp)
        os.replace(tmp, os.path.join(where, name))

    def _write_step_files(self, args, step, where, lr_scheduler):
        """This rank's generators as the Trainer saves them; on rank 0 the
        schedule (the Trainer reads it on every rank)."""
        states = {"python": random.getstate(), "numpy": np.random.get_state(),
                  "cuda": paddle.get_rng_state(),
                  "cpu": paddle.framework.core.default_cpu_generator().get_state(),
                  "world_size": args.world_size}
        self._save(states, where, "rng_state_%d.pth" % paddle.distributed.get_rank())
        if args.process_index == 0 and lr_scheduler is not None:
            self._save(lr_scheduler.state_dict(), where, _SCHEDULER)

    def _write_placeholders(self, folder, step):
        # Loaded by the Trainer before training starts: weights that set
        # nothing, an optimizer state with nothing but the schedule (which
        # Paddle requires with an LRScheduler); the callback fills both from
        # zccd right after.
        args = self._args
        paddle.save({}, os.path.join(folder, _variant(_WEIGHTS, args.weight_name_suffix)))
        optimizer = {}
        schedule = os.path.join(folder, _SCHEDULER)
        if os.path.isfile(schedule):
            optimizer["LR_Scheduler"] = paddle.load(schedule)
        paddle.save(optimizer, os.path.join(folder, _variant(_OPTIMIZER,
                                                             args.optimizer_name_suffix)))
        open(os.path.join(folder, ".checkpoint_done"), "w").close()
