"""zcc.torch: checkpoint a PyTorch training loop with zcc.

    from zcc.torch import Checkpointer

    ckpt = Checkpointer(model, optimizer, job_id="mlp", save_every=100, ema_decay=0.999,
                        scheduler=scheduler, user_state={"epoch": 0})
    start = (ckpt.restore() or 0) + 1          # None: nothing to restore, start fresh
    for step in range(start, steps + 1):
        loss = model(batch()).loss
        loss.backward()
        optimizer.step()                       # zcc fences first (see below)
        optimizer.zero_grad()
        scheduler.step()
        ckpt.step(step)                        # enqueue the snapshot; microseconds
    eval_model.load_state_dict(ckpt.ema_state_dict())
    ckpt.close()

What is registered (once, in the constructor; names are checkpoint keys):

* every parameter (``model.named_parameters()``), kind PARAM, EMA-eligible when
  F32/F16/BF16, registered in place: zcc copies straight from the parameter's
  memory. Persistent buffers (BatchNorm statistics...) are PARAM too, staged
  through a shadow copy refreshed at ``step()``, because the forward pass
  updates them in place where no fence can protect them. The checkpoint's
  ``model.safetensors.index.json`` therefore maps the model's state-dict keys
  (tied parameters appear once, under their first name).
* the optimizer state, kind OPTIM, as ``optimizer.state.<param name>.<key>``.
  PyTorch creates it lazily at the first ``optimizer.step()``, so the
  constructor allocates buffers shaped like it (not written until a restore,
  the first step, or step()'s zeroing of any still unbound): for torch.optim.Adam,
  AdamW, SGD and RMSprop from the layout their source fixes (no step taken);
  for other optimizers from a probe step (gradients set to zero, every
  group's ``lr`` set to 0) after which everything the probe could have
  changed is put back: parameter values, gradients, learning rates, the
  optimizer's state and step counter and the torch RNG. State the optimizer
  already has (Adagrad creates it in its constructor; or the Checkpointer is
  created after a step) is registered as it is. The optimizer is left with no
  state for the other parameters, exactly as before: its first real step
  initialises the state as it always would, and ``step()`` then copies those
  values into the registered buffers and makes them the optimizer's state
  tensors (an exact copy), which optimizers such as Adam, AdamW, SGD and
  RMSprop update in place from then on. ``restore()`` installs the restored
  buffers as the state directly. An optimizer that replaces a state tensor
  instead of updating it is handled the same way at every ``step()`` (copy,
  then rebind), only slower. Training numerics are therefore unchanged; the
  resume test checks this bit for bit.
* small state, kind EXTRA, in fixed-size byte buffers registered once and
  rewritten at every ``step()``. The job's, written once for the whole job:
  ``zcc.trainer_state`` (step, world size, the optimizer's param_groups
  without their params, non-tensor optimizer state, and
  ``scheduler.state_dict()``). Each rank's own: ``zcc.rNNNNN.torch_rng``
  (``torch.get_rng_state()``) and ``zcc.rNNNNN.rank_state`` (the Python,
  NumPy and CUDA generators, the ``user_state`` dict, and each ``state``
  object's ``state_dict()`` with its tensors and NumPy arrays tagged as
  dtype, shape and bytes). These are pickled plain data (None, bool, int,
  float, str, bytes, and lists, tuples, dicts and sets of them; a container's
  subclass, such as an OrderedDict, is stored as the container) and unpickled
  by a loader that refuses everything else but the builtin containers and
  numbers, so restoring never runs code from the checkpoint. Callables in a
  scheduler's state dict (OneCycleLR's ``anneal_func`` in PyTorch 1.13) are
  left out: the scheduler constructed on
  resume has its own. Each blob is sized at construction to twice what it
  holds then, at least ``extra_bytes``; one outgrown later is replaced by one
  twice its new size, registered with zccd in place of the old registration
  (the EMA carried over, the rank's snapshots in zccd dropped; a warning says
  so), and ``restore()`` grows them to a step's larger ones. With
  ``replica="none"`` or a replica group of the caller's, ranks may hold
  different optimizers, and the trainer state is
  per rank too (``zcc.rNNNNN.trainer_state``): such a checkpoint restores on
  the same number of ranks only.

World size: a checkpoint restores on any number of ranks. Rank r restores
the per-rank state rank r wrote. A job that grew has ranks the checkpoint
has no state for: they keep their random generators as their script seeded
them and take rank 0's ``user_state`` (so that counters such as the epoch
agree); ``ckpt.restored_rank_state`` is False on them and a warning says so.
A job that shrank leaves the per-rank state of the ranks it lost behind, and
rank 0 warns.

Fencing: zcc copies the registered tensors after ``step()`` returns, while the
trainer goes on. The next ``optimizer.step()`` must not overwrite them before
the copies have read them, so the constructor makes ``optimizer.step`` fence
first (``fence_optimizer_step=True``): a step pre-hook of a torch.optim
optimizer, which fences whatever later stands in for its ``step`` attribute
(a loss scaler's patch, an LR scheduler's counter), else a wrapper of the
attribute. Code that updates parameters or
optimizer state outside ``optimizer.step()`` must call ``ckpt.fence()`` first.
Forward and backward only read the parameters, and buffers go through shadows.

Replicas: with ``world_size > 1`` plain (non-DTensor) parameters, buffers and
optimizer state are registered as DATA_PARALLEL replicas (DDP keeps them
identical), so each is written once per group; pass ``replica="none"`` when
ranks hold distinct plain tensors (pipeline stages; give them distinct
names).

Sharded models: DTensor parameters, buffers and optimizer state (FSDP2's
``fully_shard``, tensor parallelism's ``parallelize_module``, both on a 2-D
mesh) are registered as the pieces of their global tensors that this rank
holds, under the model's state-dict keys, so a checkpoint restores into any
other layout and world size (zcc.torch_layout). Ranks holding the same piece
form a replica group found over the process group (collective: every rank
constructs its Checkpointer). FSDP1 (flat parameters) and Partial placements
are refused with what to do instead.

Devices: the tensors' device picks the copier: the host copier for CPU
tensors, ``zcc.cuda_copier(device)`` for CUDA tensors (all on one device per
rank), loaded on first use; ``copier=`` overrides it. Snapshots, fences and
restores are then ordered on ``torch.cuda.current_stream()``. The host-side
buffers (shadows and EXTRA blobs) are still written by the CPU at ``step()``.

Thread-safety: a Checkpointer belongs to the training thread.
"""

import collections
import os
import threading

import torch

import zcc
from zcc import _checkpointer
from zcc import _plain_state
from zcc import _prefault
from zcc import _rng_state
from zcc import _torch_codec
from zcc import _torch_ema
from zcc import _torch_optim
from zcc import _torch_restore
from zcc import _torch_rng
from zcc import torch_layout

__all__ = ["Checkpointer"]

# A device's current CUDA stream as an integer (cudaStream_t): torch's own C
# accessor where this torch has it; torch.cuda.current_stream() makes a
# Stream object at every call (30-45 us of a step() call on a GPU node).
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or \
    (lambda index: torch.cuda.current_stream(index).cuda_stream)


class _GeneratorState:
    """A torch.Generator (a data loader's own, say) as a Stateful."""

    def __init__(self, generator):
        self.generator = generator

    def state_dict(self):
        return {"generator_state": self.generator.get_state()}

    def load_state_dict(self, state):
        self.generator.set_state(state["generator_state"])


def _stateful_objects(state):
    """Checkpointer's `state` argument, checked (a torch.Generator is taken
    as a Stateful: its get_state()/set_state())."""
    return _checkpointer.stateful_objects(
        state, lambda obj: _GeneratorState(obj) if isinstance(obj, torch.Generator) else obj)


class Checkpointer(_torch_optim.OptimizerBinding, _torch_restore.Restoring,
                   _torch_ema.EmaReading, _checkpointer.CheckpointerBase):
    """Registers a model, its optimizer and small trainer state with zcc.

    Args:
      model: the ``torch.nn.Module`` (a DistributedDataParallel wrapper is
        unwrapped for names).
      optimizer: a ``torch.optim.Optimizer`` over the model's parameters, or None.
      job_id: the zcc job (checkpoints go to ``<root>/<job_id>/``).
      save_every: persist every N-th step (0: only on ``save_now()``).
      ema_decay: zccd's EMA of the parameters (0: none); ``ema_interval``.
      rank, world_size: default ``$RANK``/``$WORLD_SIZE`` (torchrun), else 0/1.
      socket: zccd's socket (default ``$ZCC_SOCKET``, else zccd's default).
      root: checkpoint root (default ``$ZCC_ROOT``, else the daemon's).
      scheduler: an LR scheduler whose state is checkpointed, or None.
      user_state: a dict of plain data (tensors and NumPy arrays too)
        checkpointed with every step; restore()
        updates this same dict in place.
      replica: "data_parallel" (default when world_size > 1), "none", or a
        ``zcc.ReplicaGroup`` for the model and optimizer tensors.
      state: {name: object} of objects with ``state_dict()`` and
        ``load_state_dict()`` (PyTorch's ``Stateful``: torchdata's
        ``StatefulDataLoader``, samplers, a ``GradScaler``, your own), this
        rank's own, saved at every ``step()`` and loaded by ``restore()``; a
        ``torch.Generator`` is taken too (its ``get_state()``).
        Their state dicts may hold plain data and tensors (stored exactly);
        anything else is refused here, at construction.
      extra_bytes: the least capacity of each EXTRA blob; each is sized at
        construction to twice what it holds then, and grown when outgrown.
      fence_optimizer_step: make ``optimizer.step`` call ``fence()`` first.
      connect_timeout: how long ``restore()`` waits for the registration.
        (A registration that waits for zccd to finish the rank's previous
        trainer's last checkpoint waits in the construction instead, as long
        as that write takes, and says so in the log every 30 s.)
      prefetch_restore: zccd begins reading the newest checkpoint as this
        Checkpointer registers, so that ``restore()`` finds it read or under
        way (default True: a trainer that starts with a checkpoint on disk
        restores it). A first ``step()`` without a restore, or a restore of
        another step or from zccd's memory, drops that read; pass False when
        this trainer does not restore, to spare the disk (and its first slot:
        a ``step()`` right after construction could find only slots whose
        memory is still being reserved, and be skipped).
      backpressure, keep_last, num_slots, persist_on_failure, copier, and any
        other ``zcc.connect`` keyword: passed through. ``run_id`` is drawn here
        when not given: rank 0's, shared over the process group (collective),
        so that a step commits only from the manifests of this run.
    """

    def __init__(self, model, optimizer=None, *, job_id, save_every=0, ema_decay=0.0,
                 ema_interval=1, rank=None, world_size=None, socket=None, root=None,
                 scheduler=None, user_state=None, state=None, replica=None,
                 extra_bytes=64 << 10,
                 fence_optimizer_step=True, connect_timeout=30.0, prefetch_restore=True,
                 **connect_kwargs):
        if rank is None:
            rank = _checkpointer.env_int(["RANK"], 0)
        if world_size is None:
            world_size = _checkpointer.env_int(["WORLD_SIZE"], 1)
        if socket is None:
            socket = os.environ.get("ZCC_SOCKET", "")
        if root is None:
            root = os.environ.get("ZCC_ROOT", "")
        self.rank = rank
        self.world_size = world_size
        torch_layout.refuse_fsdp1(model)
        self.model = torch_layout.unwrap(model)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.user_state = user_state if user_state is not None else {}
        self.state = _stateful_objects(state)
        self.ema_decay = ema_decay
        self.ema_interval = max(1, ema_interval)
        self.connect_timeout = connect_timeout
        self._codec = _torch_codec.CODEC
        self._generators = _rng_state.GeneratorStates()
        self._torch_generator = _torch_rng.CpuGeneratorState()
        self._cuda_generators = _torch_rng.CudaGeneratorStates()
        self._stream_index = None  # the CUDA device whose stream the copies follow (_stream)
        self._replica = self._replica_group(replica)
        # The ranks holding copies of a plain (non-DTensor) tensor; a DTensor's
        # placements say where its copies are.
        self._plain_members = self._plain_replica_members()
        self.restored_from = None  # "memory" or "disk" after restore()
        # After restore(): whether this rank's own RNG states and user_state
        # came back (False on a rank the writing job did not have).
        self.restored_rank_state = None
        self._missing_state = frozenset()
        self._stream_device = None
        self._last_step = None
        self._ema_kept = None  # names whose EMA this rank's zccd keeps (replicas)

        pieces = []  # (name, Piece, kind, ema_eligible)
        self._params = collections.OrderedDict(self.model.named_parameters())
        self._param_names = {id(p): name for name, p in self._params.items()}
        # The step zccd's EMA is at: after restore(), what it has folded in
        # (ahead of the restored step after a restore from memory whose
        # previous trainer went further; a warning says so); after
        # ema_state_dict(), the step of the EMA it returned.
        self.ema_step = None
        self._dtensor_params = {}  # name -> the DTensor parameter (for ema_state_dict)
        for name, p in self._params.items():
            piece = torch_layout.piece_of("parameter " + name, p.detach(), rank, self._plain_members)
            if torch_layout.is_dtensor(p):
                self._dtensor_params[name] = p
            eligible = ema_decay > 0 and p.dtype in (torch.float32, torch.float16, torch.bfloat16)
            pieces.append((name, piece, "param", eligible))
        state_keys = set(self.model.state_dict().keys())
        self._buffers = []  # (the buffer's local tensor, shadow)
        for name, b in self.model.named_buffers():
            if name not in state_keys:
                continue  # non-persistent: not part of the model's state
            piece = torch_layout.piece_of("buffer " + name, b.detach(), rank, self._plain_members)
            shadow = piece.local.clone(memory_format=torch.contiguous_format)
            self._buffers.append((piece.local, shadow))
            pieces.append((name, piece._replace(local=shadow), "param", False))

        # Fresh optimizer buffers, per optimizer param: zeroed at the first
        # step() if the param's state is still not bound then (a restore or the
        # optimizer's first step overwrites them before anything reads them).
        self._unzeroed = {}
        self._opt_params = []      # optimizer params, in param_groups order
        self._opt_bufs = []        # per param: {key: registered tensor}
        self._bound = []           # per param: the optimizer's state uses our buffers
        self._binding = None       # the optimizer's state as last bound (_torch_optim)
        self._fenced = False       # no copy enqueued since the last fence
        if optimizer is not None:
            pieces += self._materialise_optimizer_state()
        placed = torch_layout.gather_members([(n, piece) for n, piece, _, _ in pieces], rank,
                                             world_size)
        pieces = [(n, piece, kind, eligible)
                  for (n, _, kind, eligible), piece in zip(pieces, placed)]
        specs = self._specs_of(pieces)

        specs += self._state_specs(extra_bytes)
        # This run of the job, the same on every rank (a step commits only
        # from manifests of one run).
        if "run_id" not in connect_kwargs:
            dist = torch.distributed
            group = dist if world_size > 1 and dist.is_available() and dist.is_initialized() \
                else None
            connect_kwargs["run_id"] = self._draw_run_id(
                group, ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"))
        if self._stream_device is not None and "copier" not in connect_kwargs:
            # CUDA tensors: the CUDA copier of their device (loads the runtime).
            connect_kwargs["copier"] = zcc.cuda_copier(device=self._stream_device.index or 0)
        self.client = zcc.connect(job_id, socket_path=socket, rank=rank, world_size=world_size,
                                  save_every=save_every, checkpoint_root=root,
                                  ema_decay=ema_decay, ema_interval=self.ema_interval,
                                  prefetch_restore=prefetch_restore, **connect_kwargs)
        self._register(specs)
        # The peer tier's membership (DESIGN.md 5c): the zccds' addresses,
        # exchanged over the process group and reported to each zccd.
        self.peer_buddies = self._share_job_peers()
        # Faulting in a GB of fresh buffers takes a while: on another core,
        # during the restore that usually follows (its wait for zccd's read).
        # Not during the registration: the faults hold the process's memory
        # map, which the registration's mappings (and gRPC's threads) wait
        # for, and it took 5x as long beside them (0.28 s against 0.05 s
        # for 1 GB of state).
        fresh = [t for ts in self._unzeroed.values() for t in ts]
        host = [t for t in fresh if t.device.type == "cpu"]
        if host:
            threading.Thread(target=_prefault.prefault, args=(host,), daemon=True).start()
        # The same fresh buffers hold nothing anyone reads before the restore
        # binds them (step() zeroes those left unbound): a restore copies each
        # as soon as zccd has checked it, while it reads the rest (on a GPU,
        # the host-to-device copies overlap zccd's read).
        fresh_ptrs = {t.data_ptr() for t in fresh}
        self._early_copy = [torch.is_tensor(s.tensor) and s.tensor.data_ptr() in fresh_ptrs
                            for s in specs] if fresh else []
        # With a process group, each replica (DDP's, or a DTensor's Replicate
        # placements) restores only the pieces it writes and receives the rest
        # over the group, so the job reads the checkpoint once: the registered
        # tensors by address, for the broadcasts (_torch_restore).
        self._by_address = None
        self._wrapped_step = None
        self._step_hook = None  # (or the step pre-hook that fences: _torch_optim)
        if optimizer is not None and fence_optimizer_step:
            self._wrap_optimizer_step()

    # ----------------------------------------------------------------- setup

    def _state_specs(self, extra_bytes):
        """The EXTRA blobs (module docstring): the job's trainer state and
        scheduler once for the whole job, each rank's RNG and user_state as
        its own, optional (a rank the writing job did not have finds none)."""
        world = tuple(range(self.world_size))
        # Job-wide state is written once when every rank holds the same
        # optimizer (DDP, FSDP2, TP); with replica="none" or a group of the
        # caller's, ranks may train different parts, and each keeps its own.
        self._job_wide = self.world_size == 1 or self._plain_members == world
        rank_prefix = "zcc.r%05d." % self.rank
        job_prefix = "zcc." if self._job_wide else rank_prefix
        job_replica = zcc.ReplicaGroup("data_parallel", self.world_size, self.rank) \
            if self._job_wide and self.world_size > 1 else zcc.ReplicaGroup()
        self._rng = torch.get_rng_state().clone()
        self._rank_state_names = {"torch_rng": rank_prefix + "torch_rng",
                                  "rank_state": rank_prefix + "rank_state"}
        # One pickle each for the job's state and for the rank's (a blob
        # written costs the trainer a pickler and a copy per step). Sized for
        # what they hold now, the trainer state as if every optimizer state
        # were bound already (it is after the first step).
        self._blobs = {
            "job": _plain_state.Blob.sized_for(job_prefix + "trainer_state",
                                               self._job_state(0, all_bound=True), extra_bytes,
                                               self._codec),
            "rank": _plain_state.Blob.sized_for(rank_prefix + "rank_state", self._rank_state(),
                                                extra_bytes, self._codec),
        }
        return [
            zcc.TensorSpec(job_prefix + "trainer_state", torch.from_numpy(self._blobs["job"].array),
                           kind="extra",
                           replica=job_replica),
            zcc.TensorSpec(rank_prefix + "torch_rng", self._rng, kind="extra", optional=True),
            zcc.TensorSpec(rank_prefix + "rank_state", torch.from_numpy(self._blobs["rank"].array),
                           kind="extra", optional=True),
        ]

    def _blob_tensor(self, array):
        return torch.from_numpy(array)

    def _job_state(self, step, all_bound=False):
        """The job's state blob: the trainer state and the scheduler's."""
        return {"trainer": self._trainer_state(step, all_bound), "scheduler": self._scheduler_state()}

    def _rank_state(self):
        """The rank's state blob: its generators (torch's CPU one aside),
        user_state and each `state` object's state dict."""
        return {"rng": self._rng_state(), "user_state": dict(self.user_state),
                "state": {name: self._stateful_state(name) for name in self.state}}

    def _plain_replica_members(self):
        group = self._replica
        if group.kind == zcc.ReplicaKind.NONE or group.group_size <= 1:
            return (self.rank,)
        if group.kind == zcc.ReplicaKind.DATA_PARALLEL and group.group_size == self.world_size:
            return tuple(range(self.world_size))
        return None  # a group the caller gave: used as given

    def _specs_of(self, pieces):
        """TensorSpecs of (name, Piece, kind, ema_eligible): replica groups
        from the pieces' members, empty pieces (an uneven shard can have no
        rows on some ranks) left out."""
        groups = torch_layout.replica_groups(
            [piece.members for _, piece, _, _ in pieces if piece.members is not None],
            self.rank, self.world_size)
        specs = []
        for name, piece, kind, eligible in pieces:
            if piece.local.numel() == 0:
                continue
            device = piece.local.device
            if device.type != "cpu":
                if self._stream_device is not None and device != self._stream_device:
                    raise ValueError("tensor '%s' is on %s and others on %s; a Checkpointer "
                                     "copies from one device (one per rank)"
                                     % (name, device, self._stream_device))
                self._stream_device = device
            replica = self._replica if piece.members is None else groups[piece.members]
            specs.append(zcc.TensorSpec(name, piece.local, kind=kind, ema_eligible=eligible,
                                        replica=replica, global_shape=piece.global_shape,
                                        offset=piece.offset))
        return specs

    def _param_name(self, p, index):
        return self._param_names.get(id(p), "param%d" % index)

    # -------------------------------------------------------------- training

    def _stream(self):
        """The current CUDA stream the copies are ordered on (0: none)."""
        if self._stream_index is None:
            if self._stream_device is None or self.client.copier == "host":
                return 0
            self._stream_index = self._stream_device.index
        return _current_raw_stream(self._stream_index)

    def _trainer_state(self, step, all_bound=False):
        opt = self.optimizer
        state = {"format": 2, "step": int(step), "world_size": self.world_size}
        if opt is not None:
            # Tensor-valued hyperparameters (lr=torch.tensor(...), betas
            # of tensors) are stored as plain data and copied back in place.
            state["param_groups"] = [{k: v for k, v in g.items() if k != "params"}
                                     for g in opt.param_groups]
            state["optimizer_step_count"] = getattr(opt, "_step_count", None)
            # One byte per optimizer parameter: a list of indices of a
            # model with 10^5 parameters would not fit a small blob.
            if all_bound:
                state["bound"] = b"\1" * len(self._bound)
                state["nontensor_state"] = {}
            else:
                state["bound"] = self._binding.bound
                state["nontensor_state"] = self._nontensor_state()
        return state

    def _rng_state(self):
        """This rank's Python, NumPy and CUDA generators (torch's CPU one is a
        tensor of its own)."""
        state = self._generators.state()
        if torch.cuda.is_initialized():
            state = dict(state)
            state["cuda_rng"] = self._cuda_generators.states()
        return state

    def _scheduler_state(self):
        if self.scheduler is None:
            return None
        return {k: v for k, v in self.scheduler.state_dict().items() if not callable(v)}

    def step(self, step, kind="full"):
        """Snapshots `step` (after optimizer.step()): returns "enqueued",
        "skipped_no_slot", "skipped_disconnected" or "skipped_copy_failed".
        Costs a fence (usually already passed), shadow copies of the buffers
        and a few small pickles."""
        # Every Python call here is paid at every training step, with the
        # CPU's caches cold after the step's compute: BENCHMARKS.md's
        # Checkpointer.step rows measure it.
        if not self._fenced:  # (the wrapped optimizer.step has fenced since the last snapshot)
            self.fence()
        b = self._binding
        if b is None or not b.in_place or self.optimizer.state is not b.container or \
                len(b.container) != b.size:  # (else nothing to bind: _state_as_bound)
            self._bind_optimizer_state()
        if self._unzeroed or self._buffers:
            self._copy_buffers()
        self._torch_generator.copy_into(self._rng)
        self._write_blobs((("job", self._job_state(step)), ("rank", self._rank_state())))
        self._last_step = step
        self._fenced = False  # from here on, copies may be reading the tensors
        return self.client.snapshot(step, kind, self._stream())

    @torch.no_grad()
    def _copy_buffers(self):
        """Zeroes the optimizer state never bound (registered before the
        first step) and copies the buffers into their shadows."""
        if self._unzeroed:
            for i, tensors in self._unzeroed.items():
                if not self._bound[i]:
                    for t in tensors:
                        t.zero_()
            self._unzeroed = {}
        for b, shadow in self._buffers:
            shadow.copy_(b)
