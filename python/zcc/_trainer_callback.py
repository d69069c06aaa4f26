"""What zcc.hf's and zcc.paddleformers' Trainer callbacks share,
framework-neutral: a Checkpointer made at the start of training and
restored to the step the Trainer resumes from, a snapshot after every
optimizer step, and for every step zccd has committed a
``<output_dir>/checkpoint-<step>/`` folder as the Trainer expects it
without the weights and optimizer state, which zccd holds.

A folder holds the Trainer's state (step, epoch, log history: the Trainer
skips the batches already trained on from it), the files every rank
wrote for that step before its snapshot (the generators, which the Trainer
puts back after skipping, and what else the framework's Trainer reads), the
framework's placeholders for the weights, and ``zcc.json`` (job and step).
The main process (rank 0) writes it once zccd reports the step committed:
a crash before that resumes from the folder before. Folders beyond the
newest ``keep_folders`` are removed (zccd's own retention keeps the steps).
A folder the Trainer wrote itself (no ``zcc.json``: training that ran
without zcc before) is the Trainer's to load; zcc goes on from that state.
"""

import dataclasses
import json
import os
import shutil
import time
import warnings

MARKER = "zcc.json"


def is_zcc_folder(path):
    """Whether the checkpoint folder at `path` is one a ZccCallback wrote."""
    return os.path.isfile(os.path.join(path, MARKER))


def newest_checkpoint_folder(output_dir):
    """The output_dir's checkpoint-<step> folder of the highest step, or None."""
    best = None
    for name in os.listdir(output_dir) if os.path.isdir(output_dir) else []:
        head, _, step = name.partition("-")
        path = os.path.join(output_dir, name)
        if head == "checkpoint" and step.isdigit() and os.path.isdir(path):
            if best is None or int(step) > best[0]:
                best = (int(step), path)
    return None if best is None else best[1]


class TrainerCallbackBase:
    """The shared half of a Trainer callback (a mixin before the framework's
    TrainerCallback). Subclasses give:
      _framework:           the Trainer's package, for messages
      _make_checkpointer(model, optimizer, lr_scheduler, args, kwargs)
      _refuse(args):        raises for training the callback does not support
      _write_step_files(args, step, where, lr_scheduler):  this rank's files
                            for step `step`'s folder, written into `where`
      _write_placeholders(folder, step):  what stands for the weights and
                            optimizer in step `step`'s folder
    """

    def __init__(self, job_id, save_every=None, keep_folders=2, commit_wait=60.0,
                 **checkpointer_kwargs):
        self.job_id = job_id
        self.save_every = save_every
        self.keep_folders = max(1, keep_folders)
        self.commit_wait = commit_wait
        self.checkpointer_kwargs = checkpointer_kwargs
        self.ckpt = None
        self._lr_scheduler = None
        self._pending = []  # rank 0: (step, captured trainer state) awaiting commit
        self._last_check = 0.0
        self._status_error = None  # the last failed status query's reason

    # ------------------------------------------------------------------ events

    def on_train_begin(self, args, state, control, model=None, optimizer=None,
                       lr_scheduler=None, **kwargs):
        if self.ckpt is not None:
            return
        if optimizer is None:
            raise ValueError("ZccCallback: the Trainer passed no optimizer")
        self._refuse(args)
        if str(getattr(args, "save_strategy", "no")).split(".")[-1].lower() != "no":
            warnings.warn("ZccCallback: the Trainer writes checkpoints of its own too "
                          "(save_strategy=%s); pass save_strategy=\"no\" to leave them to zcc"
                          % args.save_strategy)
        every = self.save_every or (args.save_steps if args.save_steps and args.save_steps >= 1
                                    else 0)
        self._save_every = int(every)
        self._lr_scheduler = lr_scheduler
        resuming = state.global_step > 0
        # A folder the Trainer wrote itself (training that ran without zcc
        # before): the state it loaded from there stands, and zcc goes on
        # from it.
        theirs = os.path.join(args.output_dir, "checkpoint-%d" % state.global_step)
        if resuming and os.path.isdir(theirs) and not is_zcc_folder(theirs):
            warnings.warn("ZccCallback: the Trainer resumed from %s, a checkpoint it wrote "
                          "itself; zcc job '%s' goes on from the state it loaded"
                          % (theirs, self.job_id))
            resuming = False
        kwargs_ = dict(self.checkpointer_kwargs)
        kwargs_.setdefault("rank", args.process_index)
        kwargs_.setdefault("world_size", args.world_size)
        kwargs_.setdefault("prefetch_restore", resuming)
        self.ckpt = self._make_checkpointer(model, optimizer, lr_scheduler, args, kwargs_)
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
            # This rank's files as this step's snapshot finds things, written
            # before the snapshot: once zccd has committed the step (which
            # needs every rank's snapshot) every rank's files are there.
            where = self._step_dir(args, step)
            os.makedirs(where, exist_ok=True)
            self._write_step_files(args, step, where, self._lr_scheduler)
            if args.process_index == 0:
                self._pending.append((step, self._capture_state(state)))
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
    def _capture_state(state):
        """The Trainer's state as its folder will hold it: trainer_state.json
        as TrainerState.save_to_json writes it."""
        return json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True) + "\n"

    @staticmethod
    def _write_trainer_state(folder, captured):
        with open(os.path.join(folder, "trainer_state.json"), "w") as f:
            f.write(captured)

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
    def _step_dir(args, step):
        return os.path.join(args.output_dir, ".zcc-rng-%d" % step)

    def _write_folder(self, args, step, trainer_state):
        final = os.path.join(args.output_dir, "checkpoint-%d" % step)
        tmp = os.path.join(args.output_dir, ".zcc-checkpoint-%d.tmp" % step)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        self._write_trainer_state(tmp, trainer_state)
        step_dir = self._step_dir(args, step)
        for name in os.listdir(step_dir) if os.path.isdir(step_dir) else []:
            if not name.startswith("."):  # (a file still being written)
                os.replace(os.path.join(step_dir, name), os.path.join(tmp, name))
        shutil.rmtree(step_dir, ignore_errors=True)
        self._write_placeholders(tmp, step)
        with open(os.path.join(tmp, MARKER), "w") as f:
            json.dump({"job_id": self.job_id, "step": step}, f)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)

    def _prune(self, args):
        ours = []
        for name in os.listdir(args.output_dir):
            path = os.path.join(args.output_dir, name)
            if name.startswith("checkpoint-") and os.path.isfile(os.path.join(path, MARKER)):
                try:
                    ours.append((int(name.split("-", 1)[1]), path))
                except ValueError:
                    continue
        for _, path in sorted(ours)[:-self.keep_folders]:
            shutil.rmtree(path, ignore_errors=True)
        # Files of saved steps that never got a folder (their commit
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
