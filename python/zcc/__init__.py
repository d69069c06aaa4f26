"""zcc: zero-cost checkpointing for training jobs (Python binding of the C++ client).

    import zcc
    client = zcc.connect(job_id="mlp", socket_path="/tmp/zcc/zccd.sock", save_every=100,
                         ema_decay=0.999)
    client.register_tensors([
        zcc.TensorSpec("fc.weight", w, kind="param", ema_eligible=True),
        zcc.TensorSpec("fc.weight.exp_avg", m, kind="optim"),
    ])
    try:
        start = client.restore() + 1          # zcc.NotFoundError: nothing to restore
    except zcc.NotFoundError:
        start = 1
    for step in range(start, steps + 1):
        ...forward/backward...
        client.fence()                       # the update must not race the copies
        optimizer_step()
        client.snapshot(step)                # "enqueued" | "skipped_..." (see Client.snapshot)
    client.close()

Tensors are any objects exposing ``__array_interface__`` (NumPy),
``__cuda_array_interface__`` or DLPack ``__dlpack__`` (PyTorch, JAX, CuPy); no
framework is linked. They must be C-contiguous and writable and must keep their
memory while registered: the client holds a reference to each until it is
closed. For PyTorch training loops use :mod:`zcc.torch`.

Client methods (each raises a :class:`zcc.Error` subclass; see :mod:`zcc.errors`):

``register_tensors(specs)``
    Once per client. Validation errors raise ``InvalidArgumentError`` (a
    ``ValueError``). When zccd is unreachable it still succeeds; the client
    registers in the background and ``stats()["connected"]`` says when.
``snapshot(step, kind="full", stream=0) -> str``
    Enqueues the copies and returns ``"enqueued"``, ``"skipped_no_slot"``,
    ``"skipped_disconnected"`` or ``"skipped_copy_failed"`` (pinning or the
    copier failed; ``stats()["last_error"]`` says why). Never raises for daemon trouble.
``fence(stream=0)``
    Before updating registered tensors: waits (host copier) until enqueued
    copies have read them.
``restore(step=zcc.LATEST, stream=0) -> int``
    Fills the registered tensors from a committed checkpoint (and zccd's EMA)
    and returns its step. ``NotFoundError`` when there is none,
    ``UnavailableError`` when not registered with zccd.
``read_ema(names=None, out=None, min_step=-1, timeout=0.0) -> (step, {name: array})``
    zccd's fp32 EMA of EMA-eligible parameters, into new NumPy arrays or the
    given float32 buffers. ``step`` is -1 before the first EMA update. With
    ``min_step``, zccd answers once the EMA includes that step (it folds
    snapshots in as it ingests them) or after ``timeout`` seconds, with the
    EMA as it is then.
``wait_connected(timeout) -> bool``
    Waits until the client is registered with zccd, at most ``timeout`` seconds.
``save_now()``, ``flush(timeout=60.0)``, ``stats() -> dict``,
``checkpoint_status() -> dict``, ``status() -> dict`` (stats plus
checkpoint status), ``close(keep_snapshots=False)`` (also ``with client:``; zccd
releases the rank's staging memory, unless keep_snapshots or the block ends in an
exception: then it keeps the newest snapshots for the next trainer).

The GIL is released whenever the C++ client may wait. A client is meant for
one thread (the trainer's); ``stats()`` may be called from any thread.
"""

import importlib
import os

# The package version: zcc's one place for it (tools/wheel/ names the wheel from it).
__version__ = "0.1.0"

from . import errors
from ._zcc import (  # noqa: F401  (re-exported API)
    LATEST,
    Backpressure,
    Client,
    ReplicaGroup,
    ReplicaKind,
    SnapshotKind,
    TensorKind,
    TensorSpec,
    describe_tensor,
)
from ._zcc import _connect
from .errors import (  # noqa: F401
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnavailableError,
    UnimplementedError,
)

__all__ = [
    "LATEST", "Backpressure", "Client", "ReplicaGroup", "ReplicaKind", "SnapshotKind",
    "TensorKind", "TensorSpec", "connect", "cuda_copier", "daemon_pull", "describe_tensor", "errors", "Error",
    "AbortedError", "AlreadyExistsError", "CancelledError", "DataLossError",
    "DeadlineExceededError", "FailedPreconditionError", "InvalidArgumentError",
    "NotFoundError", "OutOfRangeError", "PermissionDeniedError", "ResourceExhaustedError",
    "UnavailableError", "UnimplementedError",
]


def cuda_copier(device=0, chunk_bytes=64 << 20, module="zcc._zcc_cuda"):
    """The CUDA copier for ``connect(copier=...)``: copies on a low-priority
    side stream of CUDA device ``device``, ``chunk_bytes`` per
    ``cudaMemcpyAsync``. Loads the CUDA runtime on first use, never at
    ``import zcc``. ``FailedPreconditionError`` when the runtime cannot be
    loaded or no device is usable (the message says why), ``UnavailableError``
    when the device is held by another process, ``UnimplementedError`` when
    zcc was built without CUDA. (``module``: the extension that makes it; tests
    name the one built over the fake CUDA runtime.)"""
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise FailedPreconditionError(
            "zcc's CUDA copier (%s) could not be loaded: %s. It needs the CUDA runtime "
            "(libcudart.so.13): import a CUDA build of PyTorch first, or install the CUDA "
            "toolkit in /usr/local/cuda" % (module, e), code="FAILED_PRECONDITION") from e
    capsule, error = mod.copier(int(device), int(chunk_bytes))
    if error is not None:
        code, message = error
        raise errors.from_status(0, code, "CUDA copier for device %d: %s" % (device, message))
    return capsule


def daemon_pull(device=0, module="zcc._zcc_cuda"):
    """Daemon-pull for ``connect(copier=...)``: zccd copies the device tensors
    of CUDA device ``device`` into the staging slots itself, through CUDA IPC,
    and a snapshot costs the training thread one event record. zccd must run
    with ``daemon_pull: true`` (it then holds a CUDA context per GPU);
    registration fails, saying so, otherwise. The tensors must be in
    ``cudaMalloc`` memory (PyTorch's caching allocator without expandable
    segments). Loads the CUDA runtime, never at ``import zcc``; the errors of
    :func:`cuda_copier` when it cannot. (``module``: as for cuda_copier.)"""
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise FailedPreconditionError(
            "zcc's CUDA module (%s) could not be loaded: %s. It needs the CUDA runtime "
            "(libcudart.so.13): import a CUDA build of PyTorch first, or install the CUDA "
            "toolkit in /usr/local/cuda" % (module, e), code="FAILED_PRECONDITION") from e
    return mod.daemon_pull(int(device))


def connect(job_id, *, socket_path="", rank=0, world_size=1, num_slots=0, save_every=0,
            keep_last=0, checkpoint_root="", backpressure="skip", ema_decay=0.0,
            ema_interval=1, persist_on_failure=False, copier=None, rpc_timeout=30.0,
            heartbeat_interval=0.25, daemon_timeout=3.0, reconnect_max_backoff=5.0,
            restore_timeout=1800.0, prefetch_restore=False, store_credentials=None,
            upload_root="", upload_keep_last=0, node_local_root=False, run_id=""):
    """Creates a :class:`Client`; zccd need not be running.

    The keyword arguments are ``zcc::ClientOptions``'s fields (client/client.h)
    with durations in seconds: ``socket_path`` (empty: zccd's default),
    ``rank``/``world_size``, ``num_slots`` (0: daemon default), ``save_every``
    (persist every N-th step; 0: only on save_now), ``keep_last``,
    ``checkpoint_root`` (empty: the daemon's), ``backpressure`` ("skip" or
    "block", or a :class:`Backpressure`), ``ema_decay`` (0: no EMA),
    ``ema_interval``, ``persist_on_failure``, ``rpc_timeout``,
    ``heartbeat_interval``, ``daemon_timeout``, ``reconnect_max_backoff``,
    ``restore_timeout`` (one restore's deadline), ``prefetch_restore`` (a
    restart that restores at once: zccd begins reading the newest checkpoint
    as the tensors register, so that restore finds it read or under way),
    ``store_credentials`` (for an ``s3://`` ``checkpoint_root``: this job's
    own keys for the store, which zccd uses for this job's directory alone
    and keeps in memory only: a dict with boto3's names
    ``aws_access_key_id``, ``aws_secret_access_key`` and optionally
    ``aws_session_token``, or "environment" for this process's
    ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``;
    None: zccd's own credentials for that root), ``upload_root`` (the tiered
    mode: checkpoints go to ``checkpoint_root`` first and zccd uploads each
    committed step to this ``s3://bucket/prefix`` in the background, keeping
    ``upload_keep_last`` steps there; ``store_credentials`` then apply to it),
    ``node_local_root`` (with ``upload_root``, when ``checkpoint_root`` is each
    node's own disk and the nodes share no file system: each node's zccd
    uploads its own ranks' files and the step commits in the store once every
    rank's files are there; restores read the store), ``run_id`` (the job's
    run, the same on every rank and new for each run: a step commits only
    from manifests of one run, so a manifest an earlier run left never
    completes a step written again; zcc.torch's Checkpointer draws one).

    ``copier`` chooses the copy backend: None or "host" for the host copier
    (memcpy on a copy thread; host tensors only), :func:`cuda_copier` for
    CUDA tensors, :func:`daemon_pull` for CUDA tensors that zccd copies, or a
    capsule named
    ``"zcc.DeviceCopier"`` holding a ``std::shared_ptr<zcc::DeviceCopier>*``
    made by another extension built from this tree (e.g. one linking
    //cuda:cuda_copier), through which device tensors can be registered.
    """
    return _connect(job_id, socket_path, rank, world_size, num_slots, save_every, keep_last,
                    checkpoint_root, backpressure, ema_decay, ema_interval, persist_on_failure,
                    copier, rpc_timeout, heartbeat_interval, daemon_timeout,
                    reconnect_max_backoff, restore_timeout, prefetch_restore,
                    _store_keys(store_credentials), upload_root, upload_keep_last,
                    node_local_root, run_id)


def _store_keys(credentials):
    """store_credentials as (key id, secret[, token]), or None."""
    if credentials is None:
        return None
    if credentials == "environment":
        key_id = os.environ.get("AWS_ACCESS_KEY_ID", "")
        secret = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
        if not key_id or not secret:
            raise ValueError("store_credentials='environment' needs AWS_ACCESS_KEY_ID and "
                             "AWS_SECRET_ACCESS_KEY in this process's environment")
        token = os.environ.get("AWS_SESSION_TOKEN", "")
    elif isinstance(credentials, dict):
        unknown = set(credentials) - {"aws_access_key_id", "aws_secret_access_key",
                                      "aws_session_token"}
        if unknown:
            raise ValueError(f"store_credentials: unknown keys {sorted(unknown)}")
        key_id = credentials.get("aws_access_key_id", "")
        secret = credentials.get("aws_secret_access_key", "")
        token = credentials.get("aws_session_token", "") or ""
        if not key_id or not secret:
            raise ValueError("store_credentials needs aws_access_key_id and aws_secret_access_key")
    else:
        raise TypeError("store_credentials: None, 'environment' or a dict of boto3's key names")
    return (key_id, secret, token) if token else (key_id, secret)
