"""zcc.paddle: checkpoint a Paddle (3.x, dygraph) training loop with zcc.

    from zcc.paddle import Checkpointer

    ckpt = Checkpointer(model, optimizer, job_id="mlp", save_every=100, ema_decay=0.999)
    start = (ckpt.restore() or 0) + 1          # None: nothing to restore, start fresh
    for step in range(start, steps + 1):
        loss = model(x).mean()
        loss.backward()
        optimizer.step()                       # zcc fences first (see below)
        optimizer.clear_grad()
        scheduler.step()
        ckpt.step(step)                        # enqueue the snapshot; microseconds
    eval_model.set_state_dict(ckpt.ema_state_dict())
    ckpt.close()

The same shape as zcc.torch.Checkpointer, and the same checkpoint format: a
step is safetensors shards under the model's state-dict keys, so `zccctl
export` and any safetensors reader see the model whichever framework wrote it.

What is registered (once, in the constructor; names are checkpoint keys):

* every trainable parameter (``stop_gradient`` False) under its state-dict
  key, kind PARAM, EMA-eligible when float32/float16/bfloat16, registered in
  place: zcc copies straight from the parameter's memory. The rest of the
  model's state dict (BatchNorm's ``_mean`` and ``_variance``, which Paddle
  keeps as parameters that the forward pass updates, and persistable
  buffers) is PARAM too, staged through a shadow copy refreshed at
  ``step()``, since no fence protects what the forward pass writes.
* the optimizer's accumulators, kind OPTIM, as
  ``optimizer.state.<key>.<accumulator>`` (Momentum's ``velocity``; Adam's
  and AdamW's ``moment1``, ``moment2``, ``beta1_pow_acc``,
  ``beta2_pow_acc``; any optimizer's, by the names it gives them), and with
  ``multi_precision`` the fp32 master weights of float16/bfloat16
  parameters as ``optimizer.master_weight.<key>``. Paddle creates them at
  the first ``optimizer.step()``; the constructor has the optimizer create
  them now, with the values its first step would give them (zeros, the beta
  powers), so that they are registered once and nothing is copied per step.
  Paddle updates them in place; one the optimizer replaced is copied back
  into the registered tensor at ``step()`` (and the optimizer given it).
* small state, kind EXTRA (zcc.torch's layout): ``zcc.trainer_state`` for
  the job (step, world size, the learning rate and the LR scheduler's
  ``state_dict()``; the optimizer's own scheduler unless ``scheduler=``
  names another), and each rank's own, optional ``zcc.rNNNNN.rank_state``:
  Paddle's generators (``paddle.get_rng_state()``, and the CUDA ones when
  Paddle has a GPU), Python's and NumPy's, ``user_state`` and each ``state``
  object's ``state_dict()``, as plain data read back by a loader that
  refuses everything else (restoring never runs code from the checkpoint).

Fencing: zcc copies the registered tensors after ``step()`` returns, while
the trainer goes on; the constructor wraps ``optimizer.step`` with ``fence()``
so the next update waits until the copies have read them. Code that updates
parameters or accumulators outside ``optimizer.step()`` calls ``ckpt.fence()``
first. Loading weights (``set_state_dict``, ``set_value``) copies into the
parameters' memory and is fine at any time; a parameter that moves to other
memory after the Checkpointer is built (``Layer.to()`` casting it or moving it
to another device) is refused at ``step()`` and ``restore()``: build the
Checkpointer after such a move.

Replicas: with ``world_size > 1`` (``paddle.DataParallel``; ranks from
``PADDLE_TRAINER_ID``/``PADDLE_TRAINERS_NUM``, else ``RANK``/``WORLD_SIZE``)
the parameters, buffers and accumulators are registered as DATA_PARALLEL
replicas, written once per group, and so is the job's trainer state. With
Paddle's process group initialised (``paddle.distributed.init_parallel_env()``,
gloo on the CPU) ``restore()`` runs on every rank together: the newest step
every rank can restore, from zccd's memory or disk, each rank reading the
pieces it writes and receiving the others over the group (CPU tensors).
Without one, each rank restores the newest committed step on its own.

Data-parallel MoE: ``moe=zcc.paddle.Experts(prefix, experts_per_rank, ep_size)``
names the model's experts; each is checkpointed under its global expert id
(``<prefix>.<id>.<rest>``, its optimizer state likewise) in a replica group of
the data-parallel ranks holding it, so it is written once, and restored by id
on any other expert-parallel degree or number of ranks.

State spread over ranks (zcc._paddle_layout): an auto-parallel DistTensor
(``dist.shard_tensor`` with ``Shard``/``Replicate`` placements on a
``ProcessMesh``) is registered as its local value, the box of its global
tensor that this rank holds, with its accumulators placed like it (Paddle's
first step would place them so); the ranks replicating a piece write it
once. Fleet's sharding stage 1 (``fleet.distributed_optimizer`` with
``sharding_degree > 1``; ``DygraphShardingOptimizer``) keeps each
parameter's optimizer state on the rank that owns the parameter: each rank
registers the state it holds, found over the process group, so each piece
is written by its owner. Either restores into any other layout (another
mesh, sharding degree or number of ranks, or one process), the checkpoint
holding global tensors. Refused with the reason: ``Partial`` placements,
sharding with ``split_param`` (flattened slices) or tensor fusion, and
``group_sharded_parallel``'s optimizer.

Devices: CPU tensors use the host copier; GPU tensors (one device per rank)
the CUDA copier of their device, ordered on Paddle's current stream.

Thread-safety: a Checkpointer belongs to the training thread.
"""

import collections
import ctypes
import os
import warnings

import numpy
import paddle

import zcc
from zcc import _checkpointer
from zcc import _layout
from zcc import _paddle_layout
from zcc import _plain_state
from zcc import _rng_state

__all__ = ["Checkpointer", "Experts"]

_EMA_DTYPES = (paddle.float32, paddle.float16, paddle.bfloat16)


class PaddleCodec(_plain_state.TensorCodec):
    """Paddle tensors in plain state (a data loader's or a scheduler's)."""

    def is_tensor(self, value):
        return isinstance(value, paddle.Tensor)

    def to_plain(self, tensor):
        if tensor.dtype == paddle.bfloat16:
            raise TypeError("a bfloat16 tensor in zcc state: store it as float32")
        a = numpy.ascontiguousarray(tensor.detach().cpu().numpy())
        return (str(tensor.dtype).replace("paddle.", ""), list(a.shape), a.tobytes())

    def from_plain(self, current, dtype, shape, raw):
        a = numpy.frombuffer(raw, dtype=numpy.dtype(dtype)).reshape(shape).copy()
        if isinstance(current, paddle.Tensor) and list(current.shape) == shape and \
                str(current.dtype).replace("paddle.", "") == dtype:
            paddle.assign(paddle.to_tensor(a, place=current.place), output=current)
            return current
        return paddle.to_tensor(a)


_CODEC = PaddleCodec()


def _packed(state):
    """A GeneratorState's pickled form (a tuple whose list holds the engine's
    state as character codes, ~6,400 of them) with that list as bytes: a
    fifth of the pickle, written at every step()."""
    out = []
    for v in state:
        if type(v) is list:
            try:
                v = bytes(v)
            except (TypeError, ValueError):  # not small ints: kept as it is
                pass
        out.append(v)
    return tuple(out)


def _generator_states():
    """Paddle's CPU generators (and CUDA ones, where there is a GPU) as plain
    data: each GeneratorState's own pickled form, packed."""
    state = {"cpu": [_packed(s.__getstate__()) for s in paddle.get_rng_state()]}
    if paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        state["cuda"] = [_packed(s.__getstate__()) for s in paddle.get_cuda_rng_state()]
    return state


def _set_generator_states(saved):
    def rebuilt(states):
        out = []
        for s in states:
            cls = type(paddle.get_rng_state()[0])
            obj = cls.__new__(cls)
            obj.__setstate__(tuple(list(v) if type(v) is bytes else v for v in s))
            out.append(obj)
        return out

    if saved.get("cpu"):
        paddle.set_rng_state(rebuilt(saved["cpu"]))
    if saved.get("cuda") and paddle.is_compiled_with_cuda() and \
            paddle.device.cuda.device_count() > 0:
        paddle.set_cuda_rng_state(rebuilt(saved["cuda"]))


def _unwrapped(model):
    """The layer whose state-dict keys are the model's: the one under
    paddle.DataParallel and fleet.distributed_model's wrappers."""
    while isinstance(getattr(model, "_layers", None), paddle.nn.Layer) and \
            type(model).__module__.startswith("paddle."):
        model = model._layers
    return model


def _detached(t):
    """The tensor zcc reads: a parameter without its autograd (same memory)."""
    return t.detach() if not t.stop_gradient else t


class Checkpointer(_checkpointer.CheckpointerBase):
    """Registers a Paddle model, its optimizer and small trainer state with zcc.

    Args:
      model: the ``paddle.nn.Layer`` (``paddle.DataParallel`` and
        ``fleet.distributed_model``'s wrappers are unwrapped).
      optimizer: a ``paddle.optimizer.Optimizer`` over the model's
        parameters, or None.
      job_id: the zcc job (checkpoints go to ``<root>/<job_id>/``).
      save_every: persist every N-th step (0: only on ``save_now()``).
      ema_decay: zccd's EMA of the parameters (0: none); ``ema_interval``.
      rank, world_size: default ``$PADDLE_TRAINER_ID``/``$PADDLE_TRAINERS_NUM``
        (``paddle.distributed.launch``), else ``$RANK``/``$WORLD_SIZE``, else 0/1.
      socket: zccd's socket (default ``$ZCC_SOCKET``, else zccd's default).
      root: checkpoint root (default ``$ZCC_ROOT``, else the daemon's).
      scheduler: an ``paddle.optimizer.lr.LRScheduler`` whose state is
        checkpointed (default: the optimizer's learning rate, when it is one).
      user_state: a dict of plain data checkpointed with every step; restore()
        updates this same dict in place.
      state: {name: object} with ``state_dict()`` and ``load_state_dict()``
        (or ``set_state_dict()``), this rank's own, saved at every ``step()``
        and loaded by ``restore()``; plain data and Paddle/NumPy tensors.
      replica: "data_parallel" (default when world_size > 1), "none", or a
        ``zcc.ReplicaGroup`` for the model and optimizer tensors.
      moe: a ``zcc.paddle.Experts`` (or a list of them): the model's
        experts, checkpointed under their global expert ids (see Experts).
      extra_bytes: the least capacity of each EXTRA blob; each is sized at
        construction to twice what it holds then, and grown when outgrown
        (as zcc.torch's).
      fence_optimizer_step: wrap ``optimizer.step`` with ``fence()``.
      connect_timeout: how long ``restore()`` waits for the registration.
        (A registration that waits for zccd to finish the rank's previous
        trainer's last checkpoint waits in the construction instead, as long
        as that write takes, and says so in the log every 30 s.)
      prefetch_restore, backpressure, keep_last, num_slots, copier and any
        other ``zcc.connect`` keyword: as for zcc.torch.Checkpointer.
    """

    def __init__(self, model, optimizer=None, *, job_id, save_every=0, ema_decay=0.0,
                 ema_interval=1, rank=None, world_size=None, socket=None, root=None,
                 scheduler=None, user_state=None, state=None, replica=None, moe=None,
                 extra_bytes=64 << 10, fence_optimizer_step=True, connect_timeout=30.0,
                 prefetch_restore=True, **connect_kwargs):
        if rank is None:
            rank = _checkpointer.env_int(["PADDLE_TRAINER_ID", "RANK"], 0)
        if world_size is None:
            world_size = _checkpointer.env_int(["PADDLE_TRAINERS_NUM", "WORLD_SIZE"], 1)
        if socket is None:
            socket = os.environ.get("ZCC_SOCKET", "")
        if root is None:
            root = os.environ.get("ZCC_ROOT", "")
        self.rank = rank
        self.world_size = world_size
        self.model = _unwrapped(model)
        self.optimizer = optimizer
        # The optimizer holding the state under fleet's wrappers, and
        # whether that state is sharded by parameter ownership.
        self._opt, self._sharded = (None, False) if optimizer is None else \
            _paddle_layout.inner_optimizer(optimizer, paddle.optimizer.Optimizer)
        if scheduler is None and self._opt is not None and \
                isinstance(getattr(self._opt, "_learning_rate", None),
                           paddle.optimizer.lr.LRScheduler):
            scheduler = self._opt._learning_rate
        self.scheduler = scheduler
        self.user_state = user_state if user_state is not None else {}
        self.state = _checkpointer.stateful_objects(state, _Loadable.wrap)
        self.ema_decay = ema_decay
        self.ema_interval = max(1, ema_interval)
        self.connect_timeout = connect_timeout
        self._codec = _CODEC
        self._generators = _rng_state.GeneratorStates()
        self.restored_from = None
        self.restored_rank_state = None
        self.ema_step = None
        self._missing_state = frozenset()
        self._ema_kept = None
        self._fenced = False
        self._device = None  # the GPU the tensors are on, if any
        self._replica = self._replica_group(replica)

        self.moe = [] if moe is None else list(moe) if isinstance(moe, (list, tuple)) else [moe]
        for m in self.moe:
            if not isinstance(m, Experts):
                raise TypeError("moe takes zcc.paddle.Experts, not %s" % type(m).__name__)
            m._place(self.rank, self.world_size)

        pieces = []  # (checkpoint key, Piece, kind, ema_eligible, replica group of a whole tensor)
        self._params = collections.OrderedDict()   # checkpoint key -> trainable parameter
        # (what, tensor, address, DistTensor?): memory that must not move
        self._watched = []
        self._shadows = []   # (checkpoint key, the model's tensor, its shadow)
        key_of = {}          # the parameter's Paddle name -> its checkpoint key
        self._group_of = {}  # checkpoint key -> its replica group
        trainable = {id(p) for _, p in self.model.named_parameters() if not p.stop_gradient}
        for local_key, t in self.model.state_dict().items():
            key, group = local_key, self._replica
            for m in self.moe:
                found = m._global(local_key)
                if found is not None:
                    key, group = found
                    break
            if key in self._group_of:
                raise ValueError("two tensors of the model are checkpointed as '%s'" % key)
            self._group_of[key] = group
            self._note_device(key, t)
            if id(t) in trainable:
                self._params[key] = t
                key_of[t.name] = key
                piece = _paddle_layout.piece_of(key, _detached(t), self.rank)
                self._watched.append(("parameter " + local_key, t, piece.local.data_ptr(),
                                      piece.global_shape is not None))
                pieces.append((key, piece, "param",
                               ema_decay > 0 and t.dtype in _EMA_DTYPES, group))
            else:
                shadow = paddle.assign(_detached(t))
                self._shadows.append((key, t, shadow))
                pieces.append((key, _paddle_layout.piece_of(key, shadow, self.rank), "param",
                               False, group))

        self._accumulators = []  # (the optimizer's dict, its key, our tensor, spec name)
        self._owned_state = set()  # sharded optimizer state: the names this rank holds
        if optimizer is not None:
            pieces += self._register_optimizer_state(key_of)
        specs = self._specs_of(pieces) + self._state_specs(extra_bytes)

        if self._device is not None and "copier" not in connect_kwargs:
            connect_kwargs["copier"] = zcc.cuda_copier(device=self._device)
        # This run of the job, the same on every rank (a step commits only
        # from manifests of one run).
        if "run_id" not in connect_kwargs:
            connect_kwargs["run_id"] = self._draw_run_id(self._process_group())
        self.client = zcc.connect(job_id, socket_path=socket, rank=rank, world_size=world_size,
                                  save_every=save_every, checkpoint_root=root,
                                  ema_decay=ema_decay, ema_interval=self.ema_interval,
                                  prefetch_restore=prefetch_restore, **connect_kwargs)
        self._register(specs)
        self._wrapped_step = None
        if optimizer is not None and fence_optimizer_step:
            self._wrap_optimizer_step()

    # ----------------------------------------------------------------- setup

    def _note_device(self, key, t):
        place = t.place
        if place.is_cpu_place():
            return
        if not place.is_gpu_place():
            raise ValueError("tensor '%s' is on %s; zcc.paddle copies from the CPU or a GPU"
                             % (key, place))
        device = place.gpu_device_id()
        if self._device is not None and device != self._device:
            raise ValueError("tensor '%s' is on GPU %d and others on GPU %d; a Checkpointer "
                             "copies from one device (one per rank)" % (key, device, self._device))
        self._device = device

    def _optimizer_params(self):
        params = []
        for entry in self._opt._parameter_list or []:
            params += list(entry["params"]) if isinstance(entry, dict) else [entry]
        return params

    def _register_optimizer_state(self, key_of):
        """The optimizer's accumulators (and master weights), created now
        with the values its first step would give them, as pieces: a
        DistTensor parameter's placed like it (as Paddle's first step would
        place them), sharded state (fleet's sharding) held by its owners."""
        opt = self._opt
        params = [p for p in self._optimizer_params() if not p.stop_gradient]
        for p in params:
            if p.name not in key_of:
                raise ValueError("the optimizer updates parameter '%s', which is not a trainable "
                                 "parameter of the model" % p.name)
        if params:
            block = paddle.static.default_main_program().global_block()
            opt._create_accumulators(block, params)
        masters = getattr(opt, "_master_weights", None) or {}
        self._place_accumulators(params, masters)
        # With multi_precision the accumulators of a float16/bfloat16
        # parameter are keyed by its fp32 master weight's name.
        owner = dict(key_of)
        owner.update({m.name: key_of[pname] for pname, m in masters.items() if pname in key_of})
        found = []  # (the optimizer's dict, its key, the tensor, name, the parameter's key)
        for acc_name, by_param in sorted(opt._accumulators.items()):
            for pname, t in sorted(by_param.items()):
                if pname in owner:  # else another model's (an optimizer shared between models)
                    found.append((by_param, pname, t, "optimizer.state.%s.%s"
                                  % (owner[pname], acc_name), owner[pname]))
        for pname, t in sorted(masters.items()):
            if pname in key_of:
                found.append((opt._master_weights, pname, t,
                              "optimizer.master_weight.%s" % key_of[pname], key_of[pname]))
        pieces = []
        for by_param, pname, t, name, key in found:
            self._note_device(name, t)
            self._accumulators.append((by_param, pname, t, name))
            piece = _paddle_layout.piece_of(name, _detached(t), self.rank)
            if self._sharded and piece.global_shape is None:
                self._owned_state.add(name)
            pieces.append((name, piece, "optim", False, self._group_of[key]))
        return pieces

    def _place_accumulators(self, params, masters):
        """A DistTensor parameter's accumulators as DistTensors on its mesh,
        as Paddle places them at its first step: those of the parameter's
        shape with its placements, the rest (beta powers) replicated."""
        opt = self._opt
        for p in params:
            if not _paddle_layout.is_dist(p):
                continue
            target = masters[p.name].name if p.name in masters else p.name
            for by_param in opt._accumulators.values():
                acc = by_param.get(target)
                if acc is None or _paddle_layout.is_dist(acc):
                    continue
                placements = list(p.placements) if list(acc.shape) == list(p.shape) else \
                    [paddle.distributed.Replicate() for _ in p.process_mesh.shape]
                placed = paddle.distributed.shard_tensor(acc, mesh=p.process_mesh,
                                                         placements=placements)
                placed.name = acc.name
                by_param[target] = placed

    def _specs_of(self, pieces):
        """TensorSpecs of (name, Piece, kind, ema_eligible, group): the ranks
        holding each DistTensor piece and each piece of sharded optimizer
        state found over the process group (every rank's names, gathered),
        their replica groups derived from them; a whole tensor in `group`;
        empty pieces (an uneven shard can leave a rank no rows) left out.
        Collective with Paddle's process group up: every rank calls it."""
        dist = self._process_group()
        keys = [(name, tuple(p.offset), tuple(int(n) for n in p.local.shape))
                if p.global_shape is not None else (name,) if name in self._owned_state else None
                for name, p, _, _, _ in pieces]
        if dist is not None:
            def all_gather_object(mine):
                everyone = []
                dist.all_gather_object(everyone, mine)
                return everyone
            found = _layout.holders([k for k in keys if k is not None], all_gather_object,
                                    self.world_size)
            pieces = [entry if k is None else (entry[0], entry[1]._replace(members=found[k]))
                      + entry[2:] for k, entry in zip(keys, pieces)]
        elif self._owned_state:
            raise zcc.FailedPreconditionError(
                "the optimizer's state is sharded over ranks; zcc.paddle finds which ranks hold "
                "each piece over paddle.distributed's process group: build the Checkpointer "
                "after fleet.init() or init_parallel_env()")
        groups = _layout.replica_groups(
            [p.members for _, p, _, _, _ in pieces if p.members is not None],
            self.rank, self.world_size)
        specs = []
        for name, piece, kind, eligible, group in pieces:
            if int(piece.local.numel()) == 0:
                continue
            replica = group if piece.members is None else groups[piece.members]
            specs.append(zcc.TensorSpec(name, piece.local, kind=kind, ema_eligible=eligible,
                                        replica=replica, global_shape=piece.global_shape,
                                        offset=piece.offset))
        return specs

    def _state_specs(self, extra_bytes):
        """The EXTRA blobs: the job's trainer state once for the whole job,
        each rank's own state optional (a rank the writing job did not have
        finds none)."""
        rank_prefix = "zcc.r%05d." % self.rank
        job_wide = self.world_size == 1 or (
            self._replica.kind == zcc.ReplicaKind.DATA_PARALLEL and
            self._replica.group_size == self.world_size)
        job_prefix = "zcc." if job_wide else rank_prefix
        job_replica = zcc.ReplicaGroup("data_parallel", self.world_size, self.rank) \
            if job_wide and self.world_size > 1 else zcc.ReplicaGroup()
        self._rank_state_name = rank_prefix + "rank_state"
        self._blobs = {
            "job": _plain_state.Blob.sized_for(job_prefix + "trainer_state", self._job_state(0),
                                               extra_bytes, self._codec),
            "rank": _plain_state.Blob.sized_for(self._rank_state_name, self._rank_state(),
                                                extra_bytes, self._codec),
        }
        return [
            zcc.TensorSpec(job_prefix + "trainer_state", self._blobs["job"].array, kind="extra",
                           replica=job_replica),
            zcc.TensorSpec(self._rank_state_name, self._blobs["rank"].array, kind="extra",
                           optional=True),
        ]

    def _job_state(self, step):
        state = {"format": 1, "framework": "paddle", "step": int(step),
                 "world_size": self.world_size}
        if self._opt is not None:
            state["lr"] = float(self._opt.get_lr())
        if self.scheduler is not None:
            state["scheduler"] = {k: v for k, v in self.scheduler.state_dict().items()
                                  if not callable(v)}
        return state

    def _rank_state(self):
        return {"rng": dict(self._generators.state(), paddle=_generator_states()),
                "user_state": dict(self.user_state),
                "state": {name: self._stateful_state(name) for name in self.state}}

    # -------------------------------------------------------------- training

    def _stream(self):
        if self._device is None or self.client.copier == "host":
            return 0
        return paddle.device.current_stream(paddle.CUDAPlace(self._device)).cuda_stream

    def _check_memory(self):
        for what, t, address, dist in self._watched:  # (step()'s path: no is_dist() per call)
            if (t._local_value() if dist else t).data_ptr() != address:
                raise zcc.FailedPreconditionError(
                    "%s moved to other memory after the Checkpointer was built (Layer.to() "
                    "cast it or moved it to another device): zcc would copy the old memory. "
                    "Build the Checkpointer after the move" % what)
        for by_param, pname, ours, _ in self._accumulators:
            current = by_param.get(pname)
            if current is not ours:  # the optimizer replaced it: ours takes its value
                if current is not None:
                    paddle.assign(current, output=ours)
                by_param[pname] = ours

    @paddle.no_grad()
    def step(self, step, kind="full"):
        """Snapshots `step` (after optimizer.step()): returns "enqueued",
        "skipped_no_slot", "skipped_disconnected" or "skipped_copy_failed"."""
        if not self._fenced:
            self.fence()
        self._check_memory()
        for _, t, shadow in self._shadows:
            paddle.assign(_paddle_layout.local_of(t), output=_paddle_layout.local_of(shadow))
        self._write_blobs((("job", self._job_state(step)), ("rank", self._rank_state())))
        self._fenced = False
        return self.client.snapshot(step, kind, self._stream())

    # --------------------------------------------------------------- restore

    @paddle.no_grad()
    def restore(self, step=None):
        """Restores the newest committed checkpoint (or `step`) into the model,
        the optimizer's accumulators, the scheduler, the generators,
        user_state and `state` objects, and zccd's EMA. Returns the step, or
        None when the job has no checkpoint yet (without `step`; a `step` that
        cannot be restored raises zcc.NotFoundError). A model that differs from
        the checkpoint's is refused (FailedPreconditionError naming the
        tensor) before any tensor is written. Raises zcc.UnavailableError
        when zccd cannot be reached within connect_timeout."""
        if not self.wait_connected():
            raise zcc.UnavailableError("not registered with zccd after %.1f s: %s"
                                       % (self.connect_timeout, self.client.stats()["last_error"]))
        self.fence()
        self._check_memory()
        result = self._restore_growing(lambda: self._restore_tensors(step))
        if result is None:
            return None
        got = self._restored(result)
        for _, t, shadow in self._shadows:
            paddle.assign(_paddle_layout.local_of(shadow), output=_paddle_layout.local_of(t))
        job = self._blobs["job"].read() or {}
        if job.get("framework") not in (None, "paddle"):
            raise zcc.FailedPreconditionError(
                "step %d was written by zcc.%s; zcc.paddle restores its own trainer state only"
                % (got, job.get("framework")))
        if self.scheduler is not None and job.get("scheduler") is not None:
            self.scheduler.set_state_dict(_plain_state.restore_hyperparameter(
                self.scheduler.state_dict(), job["scheduler"], self._codec))
        elif self._opt is not None and job.get("lr") is not None and \
                not isinstance(self._opt._learning_rate, paddle.optimizer.lr.LRScheduler):
            self._opt.set_lr(job["lr"])
        own = self._rank_state_name not in self._missing_state
        self.restored_rank_state = own
        mine = self._blobs["rank"].read() if own else None
        saved_world = job.get("world_size", self.world_size)
        user_from_rank0 = None
        dist = self._process_group()
        if self.world_size > saved_world and dist is not None:
            # A job that grew: its new ranks take rank 0's user_state (a
            # counter such as the epoch must agree). Every rank knows
            # saved_world (the job's state), so all take part.
            box = [dict((mine or {}).get("user_state") or {}) if self.rank == 0 else None]
            dist.broadcast_object_list(box, src=0)
            if not own:
                user_from_rank0 = box[0]
        rng = self._apply_rank_state(mine, user_from_rank0)
        if rng.get("paddle"):
            _set_generator_states(rng["paddle"])
        if not own:
            warnings.warn("zcc: step %d was written by %d rank(s); rank %d had no state of its "
                          "own in it: its generators and `state` objects stay as they were%s"
                          % (got, saved_world, self.rank,
                             ", its user_state is rank 0's" if user_from_rank0 is not None
                             else ", and so does its user_state"))
        elif self.rank == 0 and saved_world > self.world_size:
            warnings.warn("zcc: step %d was written by %d ranks; the generators, user_state and "
                          "`state` objects of ranks %d-%d are not restored on %d rank(s)"
                          % (got, saved_world, self.world_size, saved_world - 1, self.world_size))
        return got

    def _process_group(self):
        dist = paddle.distributed
        if self.world_size <= 1 or not dist.is_initialized():
            return None
        return dist

    def _restore_tensors(self, step):
        """Fills the registered tensors; returns restore_tensors' dict (None:
        nothing to restore). With Paddle's process group the ranks restore
        together (Client::RestoreTogether, as zcc.torch does): the newest
        step every rank can restore, from zccd's memory or disk, each rank
        reading only the pieces it writes and receiving the rest from the
        rank that read them. Several ranks without a process group cannot
        agree on a step only some zccds hold in memory: each restores the
        newest committed step (the same on every rank: a commit is atomic
        across them)."""
        target = zcc.LATEST if step is None else step
        dist = self._process_group()
        if dist is not None and self._device is None:
            try:
                return self.client.restore_together(target, self._stream(), self.rank,
                                                    self.world_size, self._all_gather,
                                                    self._broadcast_many)
            except zcc.NotFoundError:
                if step is not None:
                    raise  # the step asked for: not "nothing to restore"
                return None
        alone = self.world_size == 1
        if not alone and step is None:
            committed = self.client.restore_candidates().get("disk", [])
            if not committed:
                return None
            target = committed[0]
            warnings.warn("zcc: %d ranks without paddle.distributed's process group (or on "
                          "GPUs) restore the newest committed step, %d, each on its own; "
                          "call paddle.distributed.init_parallel_env() before restore() to "
                          "restore from zccd's memory and read each piece once"
                          % (self.world_size, target))
        try:
            return self.client.restore_tensors(target, self._stream(), allow_older=alone and
                                               step is None)
        except zcc.NotFoundError:
            if step is not None:
                raise
            return None

    def _all_gather(self, mine):
        """Every rank's `mine` (bytes), by rank: RestoreTogether's all-gather."""
        everyone = []
        paddle.distributed.all_gather_object(everyone, bytes(mine))
        return everyone

    @staticmethod
    def _host_bytes(address, n):
        """A writable NumPy view of n bytes of host memory at `address` (a
        registered CPU tensor's)."""
        return numpy.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(address))

    def _broadcast_many(self, pieces, root):
        """RestoreTogether's broadcasts from `root`: `pieces` are (address,
        nbytes) of registered tensors (address 0 where this rank keeps no
        copy), sent packed in one broadcast over the process group."""
        flat = numpy.empty(sum(n for _, n in pieces), dtype=numpy.uint8)
        offset = 0
        if self.rank == root:
            for address, n in pieces:
                flat[offset:offset + n] = self._host_bytes(address, n)
                offset += n
        packed = paddle.to_tensor(flat)
        paddle.distributed.broadcast(packed, src=root)
        if self.rank != root:
            received = packed.numpy()
            for address, n in pieces:
                if address:
                    self._host_bytes(address, n)[:] = received[offset:offset + n]
                offset += n

    # ------------------------------------------------------------------- EMA

    def ema_state_dict(self, timeout=30.0, include_buffers=True):
        """zccd's fp32 EMA of the parameters, as {key: float32 paddle.Tensor},
        once it includes the last snapshot this client published (waits up
        to `timeout`; warns and returns the EMA as it is after that). With
        replicas, only the parameters whose EMA this rank's zccd keeps.
        include_buffers adds the rest of the model's state dict as it is now,
        so that the result loads with ``set_state_dict``."""
        _, arrays = self._read_ema(timeout)
        out = collections.OrderedDict(
            (n, paddle.to_tensor(arrays[n])) for n in self._kept_ema_names())
        for name, p in self._params.items():
            # A DistTensor parameter's EMA as a DistTensor placed like it,
            # so that the auto-parallel model loads it (a rank with no rows
            # of it holds none).
            if not _paddle_layout.is_dist(p):
                continue
            local = p._local_value()
            if name not in out and int(local.numel()) > 0:
                continue  # another replica keeps it
            placed = paddle.assign(_detached(p))  # a copy: never the parameter itself
            if placed.dtype != paddle.float32:
                placed = paddle.cast(placed, "float32")
            if name in out:
                paddle.assign(out.pop(name).reshape(list(local.shape)),
                              output=placed._local_value())
            out[name] = placed
        if include_buffers:
            for key, t, _ in self._shadows:
                out[key] = paddle.assign(_detached(t))
        return out


class Experts:
    """Data-parallel MoE: where a model's experts live, so that each is
    checkpointed under its global expert id, written once however many
    data-parallel replicas hold it, and restored by id into any other
    expert-parallel degree.

    The layout of the seeds (PaddleNLP's and PaddleFormers' DP-MoE): ranks
    form ``world_size // ep_size`` data-parallel groups of ``ep_size`` ranks
    each (rank = dp_index * ep_size + ep_rank); the experts are split across
    the ranks of a group, ``experts_per_rank`` each, so rank r holds global
    experts ``ep_rank * experts_per_rank + i`` for local i; the same expert on
    the other groups is its data-parallel replica. A state-dict key
    ``<prefix>.<i>.<rest>`` of the model is checkpointed as
    ``<prefix>.<global id>.<rest>`` (its optimizer state likewise), in an
    expert replica group of the ranks holding that expert. Restoring on
    another layout (``ep_size=1`` and every expert on every rank, or one
    process) reads each expert by its global name.

      Experts("moe.experts", experts_per_rank=2, ep_size=2)

    Dense parameters (everything else) stay replicated over the whole job.
    Expert ids must stay below 2**31.
    """

    def __init__(self, prefix, experts_per_rank, ep_size=1):
        if not prefix or prefix.endswith("."):
            raise ValueError("Experts prefix %r: the state-dict key before the expert index, "
                             "without a trailing '.'" % (prefix,))
        if experts_per_rank < 1 or ep_size < 1:
            raise ValueError("experts_per_rank and ep_size must be at least 1")
        self.prefix = prefix
        self.experts_per_rank = int(experts_per_rank)
        self.ep_size = int(ep_size)
        self.ep_rank = self.dp_index = None
        self.dp_size = 1

    def _place(self, rank, world_size):
        if world_size % self.ep_size:
            raise ValueError("ep_size %d does not divide the world size %d"
                             % (self.ep_size, world_size))
        self.ep_rank = rank % self.ep_size
        self.dp_index = rank // self.ep_size
        self.dp_size = world_size // self.ep_size

    def global_id(self, local_index):
        """The global expert id of this rank's expert `local_index`."""
        if not 0 <= local_index < self.experts_per_rank:
            raise ValueError("local expert %d: this rank holds %d experts under %s"
                             % (local_index, self.experts_per_rank, self.prefix))
        return self.ep_rank * self.experts_per_rank + local_index

    def _global(self, key):
        """(checkpoint key, replica group) of a state-dict key under the
        prefix, or None for any other key."""
        head = self.prefix + "."
        if not key.startswith(head):
            return None
        local, dot, rest = key[len(head):].partition(".")
        if not local.isdigit() or not dot:
            return None
        expert = self.global_id(int(local))
        group = zcc.ReplicaGroup("expert_data_parallel", self.dp_size, self.dp_index,
                                 expert_id=expert) if self.dp_size > 1 else zcc.ReplicaGroup()
        return "%s%d.%s" % (head, expert, rest), group


class _Loadable:
    """A `state` object with Paddle's set_state_dict() and no
    load_state_dict() (LRScheduler, a Layer), as one with both."""

    def __init__(self, obj):
        self.obj = obj

    def state_dict(self):
        return self.obj.state_dict()

    def load_state_dict(self, state):
        self.obj.set_state_dict(state)

    @classmethod
    def wrap(cls, obj):
        if callable(getattr(obj, "load_state_dict", None)) or \
                not callable(getattr(obj, "set_state_dict", None)):
            return obj
        return cls(obj)
