"""What zcc.torch's and zcc.paddle's Checkpointers share, framework-neutral:
the environment's rank and world size, `state` objects checked, the small
state blobs written at step() and applied at restore() (Python and NumPy
generators, user_state, `state` objects), where a restore came from, the
EMA names zccd keeps for this rank, and the methods that only talk to the
client."""

import os
import re
import uuid
import warnings
import weakref

import zcc
from zcc import _plain_state
from zcc import _rng_state


def env_int(names, default):
    """The first of the environment variables `names` that is set, as an int."""
    for n in names:
        if os.environ.get(n, "") != "":
            return int(os.environ[n])
    return default


def stateful_objects(state, adapt=None):
    """A Checkpointer's `state` argument, checked: names as checkpoint keys
    take them, objects with state_dict() and load_state_dict(); `adapt` may
    turn an object into one first (a framework's random generator)."""
    if state is None:
        return {}
    if not isinstance(state, dict):
        raise TypeError("state must be a dict {name: object with state_dict() and "
                        "load_state_dict()}, not %s" % type(state).__name__)
    if adapt is not None:
        state = {name: adapt(obj) for name, obj in state.items()}
    for name, obj in state.items():
        if not isinstance(name, str) or not name or \
                not all(c.isalnum() or c in "_.-" for c in name):
            raise ValueError("state name %r: use letters, digits, '_', '.' and '-'" % (name,))
        if not (callable(getattr(obj, "state_dict", None)) and
                callable(getattr(obj, "load_state_dict", None))):
            raise TypeError("state[%r] is a %s without state_dict() and load_state_dict()"
                            % (name, type(obj).__name__))
    return dict(state)


class CheckpointerBase:
    """The framework-neutral half of a Checkpointer (a mixin). It expects
    self.client, self.connect_timeout, self.ema_decay, self.user_state,
    self.state ({name: object}), self.optimizer, self.rank, self.world_size,
    self._codec (the framework's _plain_state.TensorCodec) and _stream()
    (the framework's current stream for the copier, 0 on the host)."""

    # --------------------------------------------------------------- setup

    def _replica_group(self, replica):
        """The replica group of the model's (non-sharded) tensors."""
        if isinstance(replica, zcc.ReplicaGroup):
            return replica
        if replica is None:
            replica = "data_parallel" if self.world_size > 1 else "none"
        if replica == "data_parallel":
            return zcc.ReplicaGroup("data_parallel", self.world_size, self.rank)
        if replica == "none":
            return zcc.ReplicaGroup()
        raise ValueError("replica must be 'data_parallel', 'none' or a zcc.ReplicaGroup")

    def _draw_run_id(self, dist, launcher_env=None):
        """This run of the job's id, the same on every rank: rank 0's, sent
        with `dist.broadcast_object_list` (torch.distributed or
        paddle.distributed with its process group up; collective), else a
        fresh one on a single rank, else the launcher's run id and restart
        count from the environment variables `launcher_env` names, else ""
        (none: commits do not compare runs)."""
        if dist is not None:
            box = [uuid.uuid4().hex if self.rank == 0 else None]
            dist.broadcast_object_list(box, src=0)
            return box[0]
        if self.world_size <= 1:
            return uuid.uuid4().hex
        if launcher_env is not None and os.environ.get(launcher_env[0], ""):
            return "%s.%s" % (os.environ[launcher_env[0]], os.environ.get(launcher_env[1], "0"))
        return ""

    def _register(self, specs):
        """Registers `specs` with the connected client (closing it if zccd
        refuses them)."""
        try:
            self.client.register_tensors(specs)
        except BaseException:
            self.client.close()
            raise
        self._specs = specs
        self._ema_names = [s.name for s in specs if s.ema_eligible]

    def _wrap_optimizer_step(self, markers=()):
        """Makes optimizer.step fence first, as a bound method (a scheduler
        created afterwards may wrap it again) that holds the Checkpointer
        weakly and stops fencing once the client is closed. `markers`: the
        attributes of the step being wrapped to carry over (PyTorch's LR
        schedulers mark the step they wrap, and warn when it is replaced)."""
        opt = self.optimizer
        previous = opt.step  # bound method, or a scheduler's counting wrapper
        self._previous_step_attr = opt.__dict__.get("step")
        ref = weakref.ref(self)

        def step(_opt, *args, **kwargs):
            ckpt = ref()
            if ckpt is not None and not ckpt.client.closed:
                ckpt.fence()
            return previous(*args, **kwargs)

        for marker in markers:
            if getattr(previous, marker, False):
                setattr(step, marker, True)
        self._wrapped_step = step.__get__(opt, type(opt))
        opt.step = self._wrapped_step

    # ------------------------------------------------------------ training

    def fence(self):
        """Waits until enqueued copies have read the tensors (before updating them)."""
        self.client.fence(self._stream())
        self._fenced = True

    # ---------------------------------------------------------- small state

    def _stateful_state(self, name):
        """The state dict of ``state[name]`` (its blob's pickler writes the
        tensors in it as plain data)."""
        return self.state[name].state_dict()

    def _write_blobs(self, values):
        """Writes each (blob key, value) pair into its blob; a blob the value
        outgrew is grown first (_grow_blobs)."""
        for key, value in values:
            try:
                self._blobs[key].write(value)
            except _plain_state.BlobOutgrown as e:
                self._grow_blobs({key: _plain_state.blob_bytes(e.need)}, value)
                self._blobs[key].write_payload(e.payload)

    def _blob_tensor(self, array):
        """What a TensorSpec of a blob's array holds (the framework's view)."""
        return array

    def _grow_blobs(self, sizes, value=None):
        """Replaces each blob `key` of `sizes` with one of that many bytes
        and registers them with zccd in place of the old ones
        (Client.replace_tensors: the rank's EMA stays in zccd; the snapshots
        zccd held of this rank are dropped, the next step() snapshots into
        the new registration). `value`, when given: what outgrew the blob,
        named part by part in the error if zccd refuses (the step is then not
        snapshotted, the old blobs stay)."""
        grown = dict(self._blobs)
        for key, size in sizes.items():
            grown[key] = _plain_state.Blob(self._blobs[key].name, size, self._codec)
        by_name = {b.name: grown[key] for key, b in self._blobs.items() if key in sizes}
        specs = [s if s.name not in by_name else
                 zcc.TensorSpec(s.name, self._blob_tensor(by_name[s.name].array), kind="extra",
                                replica=s.replica, optional=s.optional)
                 for s in self._specs]
        try:
            self.client.replace_tensors(specs)
        except zcc.Error as e:
            parts = ("; its parts: %s" % _plain_state.part_sizes(value, self._codec)) \
                if isinstance(value, dict) else ""
            raise type(e)(("zcc state %s outgrew %s and zccd refused the larger registration "
                          "(%s); this step was not snapshotted: pass Checkpointer(extra_bytes=%d) "
                          "or more%s" % (", ".join(repr(n) for n in by_name),
                                         "its buffer" if len(by_name) == 1 else "their buffers",
                                         e, max(sizes.values()), parts)), e.code) from None
        warnings.warn("zcc: state %s grew to %s bytes (from %s): registered again with zccd in "
                      "place of the old buffers; the EMA stays, the snapshots zccd held of rank "
                      "%d are dropped (the next step() is the new registration's first)"
                      % (", ".join(repr(n) for n in by_name),
                         "/".join(str(sizes[k]) for k in sizes),
                         "/".join(str(len(self._blobs[k].array)) for k in sizes), self.rank))
        self._blobs = grown
        self._specs = specs
        self._by_address = None

    _TOO_SMALL = re.compile(r"extra tensor '([^']+)' holds (\d+) bytes in ")

    def _grow_for_restore(self, error):
        """After a restore refused because blobs were registered smaller
        than the step holds them (this rank's or another's): grows this
        rank's named blobs to the step's size and returns True (every rank
        then restores again); False for any other error."""
        found = self._TOO_SMALL.findall(str(error))
        if not found:
            return False
        by_name = {b.name: key for key, b in self._blobs.items()}
        sizes = {by_name[n]: int(size) for n, size in found
                 if n in by_name and int(size) > len(self._blobs[by_name[n]].array)}
        if sizes:
            self._grow_blobs(sizes)
        return True

    def _restore_growing(self, restore_once):
        """restore_once() again after growing the blobs a restore found too
        small (a step written after they grew, restored by a trainer that
        sized them afresh): at most once per blob and rank that can be
        named, bounded."""
        for attempt in range(8):
            try:
                return restore_once()
            except zcc.FailedPreconditionError as e:
                if attempt == 7 or not self._grow_for_restore(e):
                    raise

    def _apply_rank_state(self, mine, user_from_elsewhere=None):
        """Puts back what a rank-state blob holds: the Python and NumPy
        generators, user_state (or `user_from_elsewhere` when this rank has
        none) and each `state` object. Returns the blob's generator dict, for
        the framework's own generators."""
        rng = (mine or {}).get("rng") or {}
        if mine is not None:
            if "python_random" in rng:
                _rng_state.set_python_rng_state(rng["python_random"])
            _rng_state.set_numpy_rng_state(rng.get("numpy_random"))
        user = mine.get("user_state") if mine is not None else user_from_elsewhere
        if user is not None:
            self.user_state.clear()
            self.user_state.update(_plain_state.restore_hyperparameter(None, user, self._codec))
        saved_objects = (mine or {}).get("state") or {}
        for name, obj in self.state.items():
            if name in saved_objects:
                obj.load_state_dict(
                    _plain_state.restore_hyperparameter(None, saved_objects[name], self._codec))
        return rng

    # -------------------------------------------------------------- restore

    def _restored(self, result):
        """Notes where the restore came from, the optional state the step
        lacks and the step of zccd's EMA now, warning when that is ahead of
        the restored step; returns the step."""
        self.restored_from = result["source"]
        self._missing_state = frozenset(result.get("missing", ()))
        self._restoring_step = result["step"]
        ema_step = result.get("ema_step", -1)
        if self.ema_decay > 0 and ema_step >= 0:
            self.ema_step = ema_step
            if ema_step > result["step"]:
                warnings.warn(
                    "zcc restored step %d from memory with an EMA that has folded in steps up "
                    "to %d (the previous trainer's); steps replayed are not folded in twice"
                    % (result["step"], ema_step))
        return result["step"]

    def _kept_ema_names(self):
        """The EMA-eligible names whose EMA this rank's zccd keeps (with
        replicas, those this rank writes)."""
        if self._ema_kept is not None:
            return self._ema_kept
        try:
            self.client.read_ema(self._ema_names)
            self._ema_kept = list(self._ema_names)
        except zcc.NotFoundError:
            kept = []
            for name in self._ema_names:
                try:
                    self.client.read_ema([name])
                    kept.append(name)
                except zcc.NotFoundError:
                    pass
            self._ema_kept = kept
        return self._ema_kept

    def _read_ema(self, timeout):
        """(step, {name: float32 NumPy array}) of zccd's EMA once it includes
        the last snapshot this client published (waits up to `timeout`; warns
        and returns it as it is after that)."""
        if self.ema_decay <= 0:
            raise zcc.FailedPreconditionError("the Checkpointer was created without ema_decay")
        self.client.flush()
        last = self.client.stats()["last_published_step"]
        target = last - last % self.ema_interval if last >= 0 else -1
        names = self._kept_ema_names()
        # zccd folds snapshots in as it ingests them: it answers once the EMA
        # includes `target`, or after `timeout` with the EMA as it is.
        ema_step, arrays = self.client.read_ema(names, min_step=target, timeout=timeout)
        if ema_step < target:
            warnings.warn("zcc EMA is at step %d; the last published snapshot is step %d"
                          % (ema_step, last))
        self.ema_step = ema_step
        return ema_step, arrays

    # ---------------------------------------------------------------- other

    def wait_connected(self, timeout=None):
        """Waits until the client is registered with zccd; False on timeout."""
        return self.client.wait_connected(self.connect_timeout if timeout is None else timeout)

    def put_job_file(self, name, content):
        """Stores a small file with the job (bytes; a Hugging Face config.json,
        tokenizer files): ``zccctl export`` writes it next to the weights.
        Waits up to connect_timeout for the registration."""
        self.wait_connected()
        self.client.put_job_file(name, bytes(content))

    def save_now(self):
        """Asks zccd to persist the next full snapshot it takes in from each
        rank of this job on this node. A snapshot already enqueued and not
        yet taken in counts, so it is usually the newest one: the step just
        passed to ``step()``, or the one after it."""
        self.client.save_now()

    def status(self):
        """The client's counters and the daemon's checkpoint status (a dict)."""
        return self.client.status()

    def flush(self, timeout=60.0):
        """Blocks until every snapshot enqueued so far has been handed to
        zccd (or dropped because zccd went away), at most ``timeout``
        seconds. It does not wait for checkpoints to be written: the status's
        ``last_committed_step`` says which step is on disk."""
        self.client.flush(timeout)

    def close(self, keep_snapshots=False):
        """Publishes snapshots in flight, unregisters and releases the tensors.
        zccd releases this rank's staging memory at once, unless
        keep_snapshots=True: then it keeps the newest snapshots for
        retain_snapshots_s, so that a trainer started next (a launcher's
        restart) restores from memory. Leaving a ``with`` block by an exception
        keeps them, and so does a Checkpointer that is never closed (a script
        that dies), as for a trainer that crashed."""
        hook = getattr(self, "_step_hook", None)
        if hook is not None:
            hook.remove()
            self._step_hook = None
        opt = self.optimizer
        if self._wrapped_step is not None and opt is not None and \
                opt.__dict__.get("step") is self._wrapped_step:
            if self._previous_step_attr is None:
                del opt.step
            else:
                opt.step = self._previous_step_attr
        # (A wrapper installed on top of ours, e.g. by a later LR scheduler,
        # keeps calling ours, which stops fencing once the client is closed.)
        self._wrapped_step = None
        self.client.close(keep_snapshots=keep_snapshots)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(keep_snapshots=exc_type is not None)
        return False
