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
* small per-rank state, kind EXTRA, in fixed-size byte buffers
  ``zcc.rNNNNN.<what>`` registered once and rewritten at every ``step()``:
  ``torch_rng`` (``torch.get_rng_state()``), ``trainer_state`` (step, the
  optimizer's param_groups without their params, non-tensor optimizer state,
  Python/NumPy/CUDA RNG states), ``scheduler`` (``scheduler.state_dict()``)
  and ``user_state`` (the ``user_state`` dict). These are pickled plain data
  (None, bool, int, float, str, bytes, and lists, tuples, dicts and sets of
  them) and unpickled by a loader that refuses everything else, so restoring
  never runs code from the checkpoint. Callables in a scheduler's state dict
  (OneCycleLR's ``anneal_func`` in PyTorch 1.13) are left out: the scheduler
  constructed on resume has its own. ``extra_bytes`` bounds each blob.

Fencing: zcc copies the registered tensors after ``step()`` returns, while the
trainer goes on. The next ``optimizer.step()`` must not overwrite them before
the copies have read them, so the constructor wraps ``optimizer.step`` with a
fence (``fence_optimizer_step=True``). Code that updates parameters or
optimizer state outside ``optimizer.step()`` must call ``ckpt.fence()`` first.
Forward and backward only read the parameters, and buffers go through shadows.

Replicas: with ``world_size > 1`` plain (non-DTensor) parameters, buffers and
optimizer state are registered as DATA_PARALLEL replicas (DDP keeps them
identical), so each is written once per group; pass ``replica="none"`` when
ranks hold distinct plain tensors (pipeline stages; give them distinct
names). The EXTRA blobs are per rank.

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
import ctypes
import io
import os
import pickle
import random
import struct
import sys
import threading
import warnings
import weakref

import numpy
import torch

import zcc
from zcc import torch_layout

__all__ = ["Checkpointer"]

_PLAIN_SCALARS = (type(None), bool, int, float, str, bytes)
_LEN_BYTES = 8
# The attribute an LR scheduler sets on the optimizer.step it wraps and looks
# for at its first step: PyTorch 1.x's counting wrapper, then 2.x's.
_LR_SCHEDULER_STEP_MARKERS = ("_with_counter", "_wrapped_by_lr_sched")


_PLAIN_SCALAR_TYPES = frozenset(_PLAIN_SCALARS)
_SEQUENCES = (list, tuple, set, frozenset)


def _check_plain(value, where):
    """Raises TypeError unless `value` is plain data the safe loader accepts."""
    # The fast path, taken every step: a scalar, or a flat sequence of scalars
    # (Python's RNG state is a tuple of 625 ints), checked without building a
    # path string per element.
    kind = type(value)
    if kind in _PLAIN_SCALAR_TYPES:
        return
    if kind in _SEQUENCES and _PLAIN_SCALAR_TYPES.issuperset(map(type, value)):
        return
    if isinstance(value, _PLAIN_SCALARS):
        return
    if isinstance(value, _SEQUENCES):
        for i, v in enumerate(value):
            _check_plain(v, "%s[%d]" % (where, i))
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _check_plain(k, "%s key" % where)
            _check_plain(v, "%s[%r]" % (where, k))
        return
    raise TypeError("%s is a %s; zcc stores only plain data (None, bool, int, float, str, bytes "
                    "and lists/tuples/dicts/sets of them)" % (where, type(value).__name__))


class _PlainUnpickler(pickle.Unpickler):
    """Loads plain data only: no class or function is ever looked up."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError("zcc state holds only plain data; refusing %s.%s" % (module, name))


class _Blob:
    """A fixed-size uint8 tensor registered as EXTRA: 8-byte length + pickle."""

    def __init__(self, name, capacity):
        self.name = name
        self.tensor = torch.zeros(capacity, dtype=torch.uint8)
        self._view = self.tensor.numpy()  # shares memory

    def write(self, value):
        _check_plain(value, self.name)
        payload = pickle.dumps(value, protocol=4)
        need = len(payload) + _LEN_BYTES
        if need > len(self._view):
            raise ValueError("zcc state '%s' needs %d bytes; its buffer holds %d (raise "
                             "Checkpointer(extra_bytes=...))" % (self.name, need, len(self._view)))
        self._view[:_LEN_BYTES] = list(len(payload).to_bytes(_LEN_BYTES, "little"))
        self._view[_LEN_BYTES:need] = numpy.frombuffer(payload, dtype=numpy.uint8)

    def read(self):
        n = int.from_bytes(self._view[:_LEN_BYTES].tobytes(), "little")
        if n == 0:
            return None
        if n > len(self._view) - _LEN_BYTES:
            raise zcc.DataLossError("zcc state '%s' holds a bad length %d" % (self.name, n))
        return _PlainUnpickler(io.BytesIO(self._view[_LEN_BYTES:_LEN_BYTES + n].tobytes())).load()


def _env_int(names, default):
    for n in names:
        if os.environ.get(n, "") != "":
            return int(os.environ[n])
    return default


def _python_rng_state():
    """random.getstate() with its 625 words as little-endian bytes: a third of
    the time to pickle (every snapshot carries it) and one check, not 625."""
    version, words, gauss = random.getstate()
    try:
        return (version, struct.pack("<%dI" % len(words), *words), gauss)
    except struct.error:  # not 32-bit words: kept as they are
        return (version, words, gauss)


def _set_python_rng_state(state):
    version, words, gauss = state
    if isinstance(words, bytes):  # (older checkpoints hold the tuple itself)
        words = struct.unpack("<%dI" % (len(words) // 4), words)
    random.setstate((version, tuple(words), gauss))


def _numpy_rng_state():
    np = sys.modules.get("numpy")
    if np is None:
        return None
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return (name, keys.tobytes(), int(pos), int(has_gauss), float(cached))


def _set_numpy_rng_state(state):
    np = sys.modules.get("numpy")
    if np is None or state is None:
        return
    name, keys, pos, has_gauss, cached = state
    np.random.set_state((name, np.frombuffer(keys, dtype=np.uint32).copy(), pos, has_gauss, cached))


# The optimizer state PyTorch creates lazily at the first step, written down
# for the optimizers whose layout torch/optim/*.py fixes, so that the
# constructor needs no probe step. Each function maps (optimizer, param group,
# param) to {key: (shape, dtype, device)} of the tensors that step creates, in
# creation order, or None for options it does not cover (the probe then finds
# out). Checked against the probe by binding_test under torch 1.13 and 2.15;
# other major versions are left to the probe.
_TORCH_VERSION = tuple(int(v) for v in torch.__version__.split(".")[:2])
_TORCH_2 = _TORCH_VERSION >= (2, 0)
_LAYOUTS_KNOWN = (1, 13) <= _TORCH_VERSION < (3, 0)
_CPU = torch.device("cpu")


# A state tensor shaped, typed and placed like its parameter (for a DTensor
# parameter, a DTensor of the same placements): torch.zeros_like(param).
LIKE_PARAM = "like_param"


def _layout_of(p, v):
    """The layout entry of state tensor `v` of parameter `p`, as found by the probe."""
    if torch_layout.is_dtensor(p) or torch_layout.is_dtensor(v):
        if (torch_layout.is_dtensor(p) and torch_layout.is_dtensor(v) and v.shape == p.shape
                and v.placements == p.placements and v.device_mesh == p.device_mesh):
            return LIKE_PARAM
        raise ValueError("optimizer state of shape %s next to a parameter of shape %s: zcc "
                         "registers DTensor optimizer state shaped and placed like its parameter "
                         "only" % (tuple(v.shape), tuple(p.shape)))
    if v.shape == p.shape and v.dtype == p.dtype and v.device == p.device:
        return LIKE_PARAM
    return (v.shape, v.dtype, v.device)


def _empty_state(p, layout):
    if layout == LIKE_PARAM:
        return torch.empty_like(p.detach(), memory_format=torch.contiguous_format)
    shape, dtype, device = layout
    return torch.empty(shape, dtype=dtype, device=device)


def _local(t):
    return t.to_local() if torch_layout.is_dtensor(t) else t


def _scalar_step_dtype():
    """The dtype of a CPU `step` tensor: optimizer._get_scalar_dtype() in 2.x,
    the default dtype (``torch.tensor(0.)``) in 1.13."""
    if not _TORCH_2:
        return torch.get_default_dtype()
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _adam_layout(opt, group, p):
    """Adam and AdamW."""
    if _TORCH_2:
        fused = bool(group.get("fused"))
        if group["capturable"] or fused:
            step = ((), torch.float32 if fused else _scalar_step_dtype(), p.device)
        else:
            step = ((), _scalar_step_dtype(), _CPU)
    elif opt.defaults.get("capturable") or opt.defaults.get("fused"):
        return None  # 1.13 reads these from the defaults; GPU-only, left to the probe
    else:
        step = ((), _scalar_step_dtype(), _CPU)
    layout = {"step": step, "exp_avg": LIKE_PARAM, "exp_avg_sq": LIKE_PARAM}
    if group["amsgrad"]:
        layout["max_exp_avg_sq"] = LIKE_PARAM
    return layout


def _sgd_layout(opt, group, p):
    # Without momentum SGD keeps no tensor (1.13 stores momentum_buffer=None).
    if group["momentum"] == 0:
        return {}
    return {"momentum_buffer": LIKE_PARAM}  # a clone of the gradient


def _rmsprop_layout(opt, group, p):
    layout = {}
    if _TORCH_2:  # 1.13's step is an int, not a tensor
        layout["step"] = ((), _scalar_step_dtype(), p.device if group["capturable"] else _CPU)
    layout["square_avg"] = LIKE_PARAM
    if group["momentum"] > 0:
        layout["momentum_buffer"] = LIKE_PARAM
    if group["centered"]:
        layout["grad_avg"] = LIKE_PARAM
    return layout


# Exact classes: a subclass may create other state. (Adagrad creates its state
# in its constructor, so it never needs materialising.)
_FIRST_STEP_LAYOUTS = {
    torch.optim.Adam: _adam_layout,
    torch.optim.AdamW: _adam_layout,
    torch.optim.SGD: _sgd_layout,
    torch.optim.RMSprop: _rmsprop_layout,
}


def _first_step_state_layouts(opt):
    """{param: layout} for every param of `opt`, or None when its class or
    options have no known layout."""
    layout_of = _FIRST_STEP_LAYOUTS.get(type(opt))
    if layout_of is None or not _LAYOUTS_KNOWN:
        return None
    layouts = {}
    for group in opt.param_groups:
        for p in group["params"]:
            layout = layout_of(opt, group, p)
            if layout is None:
                return None
            layouts[p] = layout
    return layouts


_TENSOR_TAG = "__zcc_tensor__"


def _plain_hyperparameter(value):
    """A param_group value as plain data: tensors (PyTorch 2.x accepts a
    tensor lr, and betas of tensors) become tagged (dtype, shape, bytes)."""
    if torch.is_tensor(value):
        t = value.detach().cpu().contiguous()
        return {_TENSOR_TAG: (str(t.dtype).replace("torch.", ""), list(t.shape),
                              t.reshape(-1).view(torch.uint8).numpy().tobytes())}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain_hyperparameter(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain_hyperparameter(v) for k, v in value.items()}
    return value


@torch.no_grad()
def _restore_hyperparameter(current, saved):
    """`saved` (from _plain_hyperparameter) as the value to put in a param
    group whose value is `current`: a tensor is filled in place, so whatever
    holds it (a scheduler, a fused kernel) sees the restored value."""
    if isinstance(saved, dict) and set(saved) == {_TENSOR_TAG}:
        dtype, shape, raw = saved[_TENSOR_TAG]
        t = torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(shape) \
            if raw else torch.empty(shape, dtype=getattr(torch, dtype))
        if torch.is_tensor(current) and current.shape == t.shape and current.dtype == t.dtype:
            current.copy_(t)
            return current
        return t
    if isinstance(saved, (list, tuple)):
        currents = current if isinstance(current, (list, tuple)) and len(current) == len(saved) \
            else [None] * len(saved)
        return type(saved)(_restore_hyperparameter(c, v) for c, v in zip(currents, saved))
    if isinstance(saved, dict):
        currents = current if isinstance(current, dict) else {}
        return {k: _restore_hyperparameter(currents.get(k), v) for k, v in saved.items()}
    return saved


_MADV_HUGEPAGE = 14
_MADV_POPULATE_WRITE = 23  # Linux 5.14+
_HUGE_PAGE = 2 << 20
_libc = None


def _prefault(tensors):
    """Faults in the pages of fresh CPU tensors without changing a byte
    (madvise MADV_POPULATE_WRITE; on an older kernel it does nothing), so that
    a restore's copy into them, or their first use, does not stop at every
    page. Their 2 MiB-aligned interiors are first marked for transparent huge
    pages (MADV_HUGEPAGE; where the system allows them only on request): 512
    times fewer faults, and fewer TLB misses in every optimizer step after.
    Runs on a thread of its own during registration and whatever comes next
    (a restore waits for zccd's disk read meanwhile); it writes nothing, so
    nothing needs to wait for it."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page = os.sysconf("SC_PAGE_SIZE")
    for t in tensors:
        start = t.data_ptr()
        end = start + t.numel() * t.element_size()
        huge_first, huge_last = -(-start // _HUGE_PAGE) * _HUGE_PAGE, end // _HUGE_PAGE * _HUGE_PAGE
        if huge_last > huge_first:
            _libc.madvise(huge_first, huge_last - huge_first, _MADV_HUGEPAGE)  # a hint
        first, last = -(-start // page) * page, end // page * page
        if last > first and _libc.madvise(first, last - first, _MADV_POPULATE_WRITE) != 0:
            return  # EINVAL: a kernel without it


class Checkpointer:
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
      user_state: a dict of plain data checkpointed with every step; restore()
        updates this same dict in place.
      replica: "data_parallel" (default when world_size > 1), "none", or a
        ``zcc.ReplicaGroup`` for the model and optimizer tensors.
      extra_bytes: capacity of each EXTRA blob.
      fence_optimizer_step: wrap ``optimizer.step`` with ``fence()``.
      connect_timeout: how long ``restore()`` waits for the registration.
      prefetch_restore: zccd begins reading the newest checkpoint as this
        Checkpointer registers, so that ``restore()`` finds it read or under
        way (default True: a trainer that starts with a checkpoint on disk
        restores it). A first ``step()`` without a restore, or a restore of
        another step or from zccd's memory, drops that read; pass False when
        this trainer does not restore, to spare the disk (and its first slot:
        a ``step()`` right after construction could find only slots whose
        memory is still being reserved, and be skipped).
      backpressure, keep_last, num_slots, persist_on_failure, copier, and any
        other ``zcc.connect`` keyword: passed through.
    """

    def __init__(self, model, optimizer=None, *, job_id, save_every=0, ema_decay=0.0,
                 ema_interval=1, rank=None, world_size=None, socket=None, root=None,
                 scheduler=None, user_state=None, replica=None, extra_bytes=64 << 10,
                 fence_optimizer_step=True, connect_timeout=30.0, prefetch_restore=True,
                 **connect_kwargs):
        if rank is None:
            rank = _env_int(["RANK"], 0)
        if world_size is None:
            world_size = _env_int(["WORLD_SIZE"], 1)
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
        self.ema_decay = ema_decay
        self.ema_interval = max(1, ema_interval)
        self.connect_timeout = connect_timeout
        self._replica = self._replica_group(replica)
        # The ranks holding copies of a plain (non-DTensor) tensor; a DTensor's
        # placements say where its copies are.
        self._plain_members = self._plain_replica_members()
        self.restored_from = None  # "memory" or "disk" after restore()
        self._stream_device = None
        self._last_step = None
        self._ema_kept = None  # names whose EMA this rank's zccd keeps (replicas)

        pieces = []  # (name, Piece, kind, ema_eligible)
        self._params = collections.OrderedDict(self.model.named_parameters())
        self._param_names = {id(p): name for name, p in self._params.items()}
        self.ema_step = None  # the step of the EMA ema_state_dict() returned last
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
        if optimizer is not None:
            pieces += self._materialise_optimizer_state()
        placed = torch_layout.gather_members([(n, piece) for n, piece, _, _ in pieces], rank,
                                             world_size)
        pieces = [(n, piece, kind, eligible)
                  for (n, _, kind, eligible), piece in zip(pieces, placed)]
        specs = self._specs_of(pieces)

        prefix = "zcc.r%05d." % rank
        self._rng = torch.get_rng_state().clone()
        specs.append(zcc.TensorSpec(prefix + "torch_rng", self._rng, kind="extra"))
        self._blobs = {}
        for what in ("trainer_state", "scheduler", "user_state"):
            self._blobs[what] = _Blob(prefix + what, extra_bytes)
            specs.append(zcc.TensorSpec(prefix + what, self._blobs[what].tensor, kind="extra"))

        if self._stream_device is not None and "copier" not in connect_kwargs:
            # CUDA tensors: the CUDA copier of their device (loads the runtime).
            connect_kwargs["copier"] = zcc.cuda_copier(device=self._stream_device.index or 0)
        self.client = zcc.connect(job_id, socket_path=socket, rank=rank, world_size=world_size,
                                  save_every=save_every, checkpoint_root=root,
                                  ema_decay=ema_decay, ema_interval=self.ema_interval,
                                  prefetch_restore=prefetch_restore, **connect_kwargs)
        # Faulting in a GB of fresh buffers costs as much as the registration:
        # on another core, during it and the restore that usually follows.
        fresh = [t for ts in self._unzeroed.values() for t in ts if t.device.type == "cpu"]
        if fresh:
            threading.Thread(target=_prefault, args=(fresh,), daemon=True).start()
        try:
            self.client.register_tensors(specs)
        except BaseException:
            self.client.close()
            raise
        self._specs = specs
        self._ema_names = [s.name for s in specs if s.ema_eligible]
        # With replicas (DDP's, or a DTensor's Replicate placements) each
        # replica restores only the pieces it writes and receives the rest
        # over the process group, so the job reads the checkpoint once.
        self._share_replicas = self.world_size > 1 and any(
            s.replica.kind != zcc.ReplicaKind.NONE for s in specs)
        self._wrapped_step = None
        if optimizer is not None and fence_optimizer_step:
            self._wrap_optimizer_step()

    # ----------------------------------------------------------------- setup

    def _replica_group(self, replica):
        if isinstance(replica, zcc.ReplicaGroup):
            return replica
        if replica is None:
            replica = "data_parallel" if self.world_size > 1 else "none"
        if replica == "data_parallel":
            return zcc.ReplicaGroup("data_parallel", self.world_size, self.rank)
        if replica == "none":
            return zcc.ReplicaGroup()
        raise ValueError("replica must be 'data_parallel', 'none' or a zcc.ReplicaGroup")

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

    def _materialise_optimizer_state(self):
        """Allocates and describes a buffer for every optimizer state tensor:
        the optimizer's own tensor where it already has state, else a fresh
        (unwritten) tensor shaped like the state its first step will create."""
        opt = self.optimizer
        params = [p for g in opt.param_groups for p in g["params"]]
        self._opt_params = params
        layouts = {}
        if any(not opt.state.get(p) for p in params):
            layouts = _first_step_state_layouts(opt)
            if layouts is None:
                layouts = self._probe_state_layouts(params)
        pieces = []
        for i, p in enumerate(params):
            bufs = {}
            existing = opt.state.get(p)
            if existing:
                items = [(k, v) for k, v in existing.items() if torch.is_tensor(v)]
            else:
                # Not zeroed here: a restore or the optimizer's first step
                # (binding) overwrites them; step() zeroes any left unbound.
                items = [(k, _empty_state(p, layout)) for k, layout in layouts[p].items()]
                self._unzeroed[i] = [_local(v) for _, v in items]
            for key, value in items:
                if not isinstance(key, str):
                    raise TypeError("optimizer state key %r is not a string" % (key,))
                # An existing tensor that is not contiguous cannot be registered
                # as is: register a copy, which binding puts in its place.
                buf = value if _local(value).is_contiguous() else torch.zeros_like(
                    value, memory_format=torch.contiguous_format)
                bufs[key] = buf
                name = "optimizer.state.%s.%s" % (self._param_name(p, i), key)
                pieces.append((name, torch_layout.piece_of(name, buf, self.rank, self._plain_members),
                               "optim", False))
            self._opt_bufs.append(bufs)
            self._bound.append(False)
        # State that existed before the Checkpointer: bind it now (copy if the
        # optimizer's tensor could not be registered as is).
        self._bind_optimizer_state()
        return pieces

    @torch.no_grad()
    def _probe_state_layouts(self, params):
        """{param: {key: (shape, dtype, device)}} of the state an optimizer of
        unknown layout creates, found by one zero-gradient, zero-lr step whose
        effects on parameters, gradients, learning rates, state, step counter
        and RNG are all undone. Costs a copy of every parameter and of any
        existing state, and a full optimizer step."""
        opt = self.optimizer
        saved_values = [p.detach().clone() for p in params]
        saved_grads = [p.grad for p in params]
        saved_lrs = [g["lr"] for g in opt.param_groups]
        saved_state = {}
        for p in params:
            if opt.state.get(p):
                objs = dict(opt.state[p])
                clones = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in objs.items()}
                saved_state[p] = (objs, clones)
        saved_count = getattr(opt, "_step_count", None)
        saved_rng = torch.get_rng_state()
        try:
            for p in params:
                p.grad = torch.zeros_like(p)
            for g in opt.param_groups:
                g["lr"] = 0.0
            try:
                # The class's step: no instance wrappers (schedulers), and in
                # PyTorch 2.x not the hook wrapper either (step hooks would
                # see a step that is not one).
                step = type(opt).step
                if getattr(step, "hooked", False) and hasattr(step, "__wrapped__"):
                    step = step.__wrapped__
                step(opt)
            except Exception as e:
                raise RuntimeError(
                    "zcc could not materialise the state of %s with a zero-gradient, zero-lr "
                    "probe step (%s); create the Checkpointer after the first optimizer.step()"
                    % (type(opt).__name__, e)) from e
            layouts = {p: {k: _layout_of(p, v) for k, v in opt.state.get(p, {}).items()
                           if torch.is_tensor(v)} for p in params}
        finally:
            for p, v, grad in zip(params, saved_values, saved_grads):
                p.copy_(v)
                p.grad = grad
            for g, lr in zip(opt.param_groups, saved_lrs):
                g["lr"] = lr
            for p in params:
                if p in saved_state:
                    objs, clones = saved_state[p]
                    for k, v in objs.items():
                        if torch.is_tensor(v):
                            v.copy_(clones[k])
                    opt.state[p] = objs
                else:
                    opt.state.pop(p, None)
            if saved_count is not None:
                opt._step_count = saved_count
            torch.set_rng_state(saved_rng)
        return layouts

    def _wrap_optimizer_step(self):
        opt = self.optimizer
        previous = opt.step  # bound method, or a scheduler's counting wrapper
        self._previous_step_attr = opt.__dict__.get("step")
        ref = weakref.ref(self)

        def step(_opt, *args, **kwargs):
            ckpt = ref()
            if ckpt is not None and not ckpt.client.closed:
                ckpt.fence()
            return previous(*args, **kwargs)

        # When ours calls an LR scheduler's wrapper, carry its marker: the
        # scheduler warns about an overridden optimizer.step otherwise.
        for marker in _LR_SCHEDULER_STEP_MARKERS:
            if getattr(previous, marker, False):
                setattr(step, marker, True)
        # A bound method, so that an LR scheduler created afterwards can wrap
        # it again (PyTorch's schedulers read step.__func__, 1.x also __self__).
        self._wrapped_step = step.__get__(opt, type(opt))
        opt.step = self._wrapped_step

    # -------------------------------------------------------------- training

    def _stream(self):
        if self._stream_device is None or self.client.copier == "host":
            return 0
        return torch.cuda.current_stream(self._stream_device).cuda_stream

    def fence(self):
        """Waits until enqueued copies have read the tensors (before updating them)."""
        self.client.fence(self._stream())

    @torch.no_grad()
    def _bind_optimizer_state(self):
        if self.optimizer is None:
            return
        state = self.optimizer.state
        for i, p in enumerate(self._opt_params):
            current = state.get(p)
            if not current:
                if self._bound[i]:
                    raise RuntimeError("the optimizer dropped its state for parameter '%s'; "
                                       "zcc cannot follow" % self._param_name(p, i))
                continue
            bufs = self._opt_bufs[i]
            for key, value in current.items():
                if torch.is_tensor(value) and key not in bufs:
                    raise RuntimeError("optimizer state '%s' of parameter '%s' appeared after "
                                       "registration; zcc cannot checkpoint it"
                                       % (key, self._param_name(p, i)))
            for key, buf in bufs.items():
                value = current.get(key)
                if value is buf:
                    continue
                if not torch.is_tensor(value) or value.shape != buf.shape or value.dtype != buf.dtype:
                    raise RuntimeError("optimizer state '%s' of parameter '%s' does not match the "
                                       "registered %s %s" % (key, self._param_name(p, i),
                                                            buf.dtype, tuple(buf.shape)))
                buf.copy_(value)
                current[key] = buf
            self._bound[i] = True

    def _trainer_state(self, step):
        opt = self.optimizer
        state = {"format": 1, "step": int(step), "python_random": _python_rng_state(),
                 "numpy_random": _numpy_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda_rng"] = [bytes(s.numpy().tobytes()) for s in torch.cuda.get_rng_state_all()]
        if opt is not None:
            # Tensor-valued hyperparameters (lr=torch.tensor(...), betas
            # of tensors) are stored as plain data and copied back in place.
            state["param_groups"] = [{k: _plain_hyperparameter(v) for k, v in g.items()
                                      if k != "params"} for g in opt.param_groups]
            state["optimizer_step_count"] = getattr(opt, "_step_count", None)
            state["bound"] = [i for i, b in enumerate(self._bound) if b]
            state["nontensor_state"] = {
                i: {k: v for k, v in opt.state[p].items() if not torch.is_tensor(v)}
                for i, p in enumerate(self._opt_params) if self._bound[i] and p in opt.state}
        return state

    def _scheduler_state(self):
        if self.scheduler is None:
            return None
        return _plain_hyperparameter({k: v for k, v in self.scheduler.state_dict().items()
                                      if not callable(v)})

    @torch.no_grad()
    def step(self, step, kind="full"):
        """Snapshots `step` (after optimizer.step()): returns "enqueued",
        "skipped_no_slot" or "skipped_disconnected". Costs a fence (usually
        already passed), shadow copies of the buffers and a few small pickles."""
        self.fence()
        self._bind_optimizer_state()
        if self._unzeroed:
            for i, tensors in self._unzeroed.items():
                if not self._bound[i]:
                    for t in tensors:
                        t.zero_()
            self._unzeroed = {}
        for b, shadow in self._buffers:
            shadow.copy_(b)
        self._rng.copy_(torch.get_rng_state())
        self._blobs["trainer_state"].write(self._trainer_state(step))
        self._blobs["scheduler"].write(self._scheduler_state())
        self._blobs["user_state"].write(dict(self.user_state))
        self._last_step = step
        return self.client.snapshot(step, kind, self._stream())

    # --------------------------------------------------------------- restore

    def wait_connected(self, timeout=None):
        """Waits until the client is registered with zccd; False on timeout."""
        return self.client.wait_connected(self.connect_timeout if timeout is None else timeout)

    @torch.no_grad()
    def restore(self, step=None):
        """Restores the newest committed checkpoint (or `step`) into the model,
        optimizer, scheduler, RNG states and user_state, and zccd's EMA.
        Returns the step, or None when the job has no checkpoint yet. Raises
        zcc.UnavailableError when zccd cannot be reached within connect_timeout."""
        unavailable = None
        if not self.wait_connected():
            unavailable = zcc.UnavailableError(
                "not registered with zccd after %.1f s: %s"
                % (self.connect_timeout, self.client.stats()["last_error"]))
        else:
            self.fence()
        got = self._restore_tensors(step, unavailable)
        if got is None:
            return None
        for b, shadow in self._buffers:
            b.copy_(shadow)
        trainer = self._blobs["trainer_state"].read() or {}
        opt = self.optimizer
        if opt is not None:
            bound = set(trainer.get("bound", []))
            nontensor = trainer.get("nontensor_state", {})
            for i, p in enumerate(self._opt_params):
                if i in bound:
                    state = dict(nontensor.get(i, {}))
                    state.update(self._opt_bufs[i])
                    opt.state[p] = state
                else:
                    opt.state.pop(p, None)
                self._bound[i] = i in bound
            groups = trainer.get("param_groups")
            if groups is not None:
                if len(groups) != len(opt.param_groups):
                    raise zcc.FailedPreconditionError(
                        "the checkpoint has %d optimizer param groups; the optimizer has %d"
                        % (len(groups), len(opt.param_groups)))
                for g, saved in zip(opt.param_groups, groups):
                    for k, v in saved.items():
                        g[k] = _restore_hyperparameter(g.get(k), v)
            if trainer.get("optimizer_step_count") is not None:
                opt._step_count = trainer["optimizer_step_count"]
        sched = self._blobs["scheduler"].read()
        if self.scheduler is not None and sched is not None:
            self.scheduler.load_state_dict(
                _restore_hyperparameter(self.scheduler.state_dict(), sched))
        torch.set_rng_state(self._rng.clone())
        if "python_random" in trainer:
            _set_python_rng_state(trainer["python_random"])
        _set_numpy_rng_state(trainer.get("numpy_random"))
        if trainer.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(s), dtype=torch.uint8)
                                          for s in trainer["cuda_rng"]])
        user = self._blobs["user_state"].read()
        if user is not None:
            self.user_state.clear()
            self.user_state.update(user)
        self._last_step = got
        return got

    def _process_group(self):
        dist = torch.distributed
        if self.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return None
        return dist

    def _restore_once(self, step, owned_only, allow_older):
        """(result, None), (None, None) when there is nothing to restore, or
        (None, error): with a process group an error must not leave this rank
        out of the collectives the others are in."""
        try:
            return self.client.restore_tensors(step, self._stream(), owned_only=owned_only,
                                               allow_older=allow_older), None
        except zcc.NotFoundError:
            return None, None
        except Exception as e:  # re-raised once every rank knows
            return None, e

    def _collective_device(self, dist):
        # NCCL reduces only device tensors; gloo takes host tensors.
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _restore_tensors(self, step, unavailable=None):
        """Fills the registered tensors; returns the step (None: nothing to
        restore). With a process group, every rank restores the same step:
        without `step`, the newest one every rank can restore (from zccd's
        memory or from disk), agreed over the group; a rank that finds it
        damaged falls back to an older one and the others follow. An error on
        any rank is raised on every rank (none is left waiting); `unavailable`
        is this rank's, found before it could ask zccd anything."""
        dist = self._process_group()
        if dist is None and unavailable is not None:
            raise unavailable
        if dist is None:
            result, error = self._restore_once(zcc.LATEST if step is None else step, False, False)
            if error is not None:
                raise error
            self.restored_from = None if result is None else result["source"]
            return None if result is None else result["step"]
        share = self._share_replicas
        target = step
        if step is None:
            try:
                if unavailable is not None:
                    raise unavailable
                offered = self.client.restore_candidates(owned_only=share)
                mine, error = sorted(set(offered["memory"]) | set(offered["disk"])), None
            except Exception as e:  # re-raised once every rank knows
                mine, error = None, e
            everyone = [None] * self.world_size
            dist.all_gather_object(everyone, mine)
            if error is not None:
                raise error
            failed = [r for r, steps in enumerate(everyone) if steps is None]
            if failed:
                raise zcc.UnavailableError("ranks %s could not list their restorable steps; see "
                                           "their logs" % failed)
            common = set(everyone[0]).intersection(*everyone[1:])
            if not common:
                if any(everyone):
                    raise zcc.FailedPreconditionError(
                        "no step can be restored by every rank (steps per rank: %s)"
                        % {r: s[-5:] for r, s in enumerate(everyone)})
                return None
            target = max(common)
        device = self._collective_device(dist)
        if unavailable is not None:
            result, error = None, unavailable
        else:
            result, error = self._restore_once(target, share, step is None)
        while True:
            # -2: this rank failed; -1: it found nothing to restore.
            got = -2 if error is not None else -1 if result is None else result["step"]
            low = torch.tensor([got], dtype=torch.int64, device=device)
            high = low.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            if error is not None:
                raise error
            if low.item() == -2:
                raise zcc.UnavailableError("another rank failed to restore step %s; see its log"
                                           % target)
            if low.item() == high.item():
                break
            if low.item() < 0:
                raise zcc.FailedPreconditionError("some ranks restored step %d and others nothing"
                                                  % high.item())
            if got != low.item():
                result, error = self._restore_once(int(low.item()), share, step is None)
        if result is None:
            return None
        if share:
            self._receive_replicas(result["restored"])
        self.restored_from = result["source"]
        return result["step"]

    @staticmethod
    def _bytes_of(t):
        return t.reshape(-1).view(torch.uint8) if t.numel() > 0 else t.new_empty(0, dtype=torch.uint8)

    def _receive_replicas(self, restored):
        """After an owned_only restore: every piece a rank did not restore
        comes from the lowest rank that did (a piece: a tensor's name and
        where it starts), one broadcast per source rank."""
        dist = torch.distributed
        specs = [s for s in self._specs if s.kind != zcc.TensorKind.EXTRA]  # per rank: own
        got = [r for s, r in zip(self._specs, restored) if s.kind != zcc.TensorKind.EXTRA]
        key = lambda spec: (spec.name, tuple(spec.offset))  # noqa: E731
        mine = sorted((key(s), s.tensor.numel() * s.tensor.element_size())
                      for s, r in zip(specs, got) if r)
        need = sorted(key(s) for s, r in zip(specs, got) if not r)
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, (mine, need))
        owner = {}
        for rank, (have, _) in enumerate(everyone):
            for k, nbytes in have:
                owner.setdefault(k, (rank, nbytes))
        sends = collections.defaultdict(dict)  # source rank -> {piece: bytes}
        for rank, (_, needs) in enumerate(everyone):
            for k in needs:
                if k not in owner:
                    # Every rank sees the same lists: all raise, none waits.
                    raise zcc.DataLossError("no rank restored '%s' (at offset %s); the checkpoint "
                                            "cannot fill it on rank %d" % (k[0], list(k[1]), rank))
                src, nbytes = owner[k]
                sends[src][k] = nbytes
        tensors = {key(s): s.tensor for s in specs}
        wanted = set(need)
        device = self._collective_device(dist)
        for src in sorted(sends):
            pieces = sorted(sends[src].items())
            flat = torch.empty(sum(n for _, n in pieces), dtype=torch.uint8, device=device)
            offset = 0
            if self.rank == src:
                for k, n in pieces:
                    flat[offset:offset + n].copy_(self._bytes_of(tensors[k]))
                    offset += n
            dist.broadcast(flat, src=src)
            if self.rank != src:
                for k, n in pieces:
                    if k in wanted:
                        self._bytes_of(tensors[k]).copy_(flat[offset:offset + n])
                    offset += n

    # ------------------------------------------------------------------- EMA

    def _kept_ema_names(self):
        if self._ema_kept is not None:
            return self._ema_kept
        try:
            self.client.read_ema(self._ema_names)
            self._ema_kept = list(self._ema_names)
        except zcc.NotFoundError:
            # Replicated parameters: zccd keeps the EMA of those this rank writes.
            kept = []
            for name in self._ema_names:
                try:
                    self.client.read_ema([name])
                    kept.append(name)
                except zcc.NotFoundError:
                    pass
            self._ema_kept = kept
        return self._ema_kept

    def ema_state_dict(self, timeout=30.0, include_buffers=True):
        """zccd's fp32 EMA of the parameters, as {name: float32 tensor}, once it
        includes the last snapshot this client published (waits up to `timeout`;
        warns and returns the EMA as it is after that). With replicas, only the
        parameters whose EMA this rank's zccd keeps. A DTensor parameter's EMA
        is a DTensor of the same placements (an FSDP2 model loads the dict). include_buffers adds the
        model's current buffers so that the result loads with load_state_dict."""
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
        out = collections.OrderedDict((n, torch.from_numpy(arrays[n])) for n in names)
        for name, p in self._dtensor_params.items():
            # A sharded parameter's EMA as a DTensor placed like it, so that
            # the sharded model loads it (ranks with no rows hold none).
            local = p.to_local()
            if name not in out and local.numel() > 0:
                continue  # another replica keeps it
            piece = out.pop(name, None)
            if piece is None:
                piece = torch.zeros(local.shape, dtype=torch.float32)
            out[name] = torch_layout.DTensor.from_local(
                piece.to(local.device), p.device_mesh, p.placements, run_check=False,
                shape=p.shape, stride=torch.empty(p.shape, device="meta").stride())
        if include_buffers:
            state_keys = set(self.model.state_dict().keys())
            for name, b in self.model.named_buffers():
                if name in state_keys:
                    out[name] = b.detach().clone()
        self.ema_step = ema_step
        return out

    # ----------------------------------------------------------------- other

    def put_job_file(self, name, content):
        """Stores a small file with the job (bytes; a Hugging Face config.json,
        tokenizer files): ``zccctl export`` writes it next to the weights.
        Waits up to connect_timeout for the registration."""
        self.wait_connected()
        self.client.put_job_file(name, bytes(content))

    def save_now(self):
        """Asks zccd to persist the next full snapshot of every rank."""
        self.client.save_now()

    def status(self):
        """The client's counters and the daemon's checkpoint status (a dict)."""
        return self.client.status()

    def flush(self, timeout=60.0):
        self.client.flush(timeout)

    def close(self, keep_snapshots=False):
        """Publishes snapshots in flight, unregisters and releases the tensors.
        zccd releases this rank's staging memory at once, unless
        keep_snapshots=True: then it keeps the newest snapshots for
        retain_snapshots_s, so that a trainer started next (a launcher's
        restart) restores from memory. Leaving a ``with`` block by an exception
        keeps them, and so does a Checkpointer that is never closed (a script
        that dies), as for a trainer that crashed."""
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
