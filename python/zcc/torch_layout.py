"""How zcc.torch describes a tensor of a PyTorch model to zcc: which piece of
which global tensor this rank holds, and which ranks hold the same piece.

A plain tensor is the whole tensor; whether other ranks hold copies of it is
the Checkpointer's ``replica`` argument (DDP: every rank). A DTensor (FSDP2's
``fully_shard``, tensor parallelism's ``parallelize_module``, or both on a 2-D
mesh) says both itself: every ``Shard(dim)`` of its placements cuts its global
tensor along ``dim`` (unevenly where the size does not divide: PyTorch's
``torch.chunk`` rule), so the local tensor is a box of the global one, and
every ``Replicate()`` names a mesh dimension whose ranks hold the same box.

Replicas become zcc replica groups (zcc._layout says how).
"""

import torch

from zcc import _layout
from zcc._layout import Piece, replica_groups  # noqa: F401 (zcc.torch's names)

try:  # public from PyTorch 2.5 (2.4: torch.distributed._tensor)
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - PyTorch without distributed
    DTensor = None


def is_dtensor(t):
    return DTensor is not None and isinstance(t, DTensor)


def _is_strided_shard(p):
    """FSDP2 over a tensor-parallel shard of the same dimension: the shard of
    a shard, which PyTorch's own rule places (below); still a box."""
    return type(p).__name__ == "_StridedShard" and _compute_local_shape_and_global_offset() is not None


def _compute_local_shape_and_global_offset():
    try:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        return compute_local_shape_and_global_offset
    except ImportError:
        return None


def _local_shape_and_offset(t):
    """PyTorch's own rule (it knows FSDP2 x TP's strided shards), checked
    against the local tensor; Shard/Replicate by hand where it is missing."""
    compute_local_shape_and_global_offset = _compute_local_shape_and_global_offset()
    if compute_local_shape_and_global_offset is not None:
        shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        return tuple(shape), tuple(offset)
    mesh = t.device_mesh
    return _layout.chunk_box(t.shape, tuple(mesh.shape), mesh.get_coordinate(),
                             [p.dim if p.is_shard() else None for p in t.placements])


def _replica_members(t, rank):
    """The global ranks whose coordinates differ from this rank's only on
    the mesh dimensions where `t` is replicated."""
    mesh = t.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError("this rank is not in the tensor's device mesh")
    index = tuple(slice(None) if p.is_replicate() else c
                  for p, c in zip(t.placements, coordinate))
    members = mesh.mesh[index].reshape(-1).tolist()
    return tuple(sorted(int(r) for r in members))


@torch.no_grad()
def piece_of(name, t, rank, plain_members):
    """The Piece of tensor `t` (named `name`, for errors). `plain_members`:
    the ranks holding copies of a plain (non-DTensor) tensor."""
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError("tensor '%s' is on device %s; zcc copies CPU tensors (the host copier) "
                         "and CUDA tensors (the CUDA copier) only" % (name, t.device.type))
    if not is_dtensor(t):
        if not t.is_contiguous():
            raise ValueError("tensor '%s' is not contiguous; zcc copies tensors as one byte range"
                             % name)
        return Piece(t, None, None, plain_members)
    for p in t.placements:
        if p.is_partial():
            raise ValueError(
                "DTensor '%s' has a Partial placement (%s): its local values are not the tensor's "
                "until they are reduced; zcc checkpoints Shard and Replicate placements only "
                "(redistribute it to Replicate() or Shard() first)" % (name, p))
        if not (p.is_shard() or p.is_replicate() or _is_strided_shard(p)):
            raise ValueError("DTensor '%s' has placement %s; zcc checkpoints Shard and Replicate "
                             "placements only" % (name, p))
    local = t.to_local()
    if not local.is_contiguous():
        raise ValueError(
            "the local shard of DTensor '%s' is not contiguous (stride %s for shape %s); zcc "
            "copies each piece as one byte range: keep the local shards contiguous (shard "
            "parameters along dim 0, as fully_shard does)" % (name, local.stride(), tuple(local.shape)))
    shape, offset = _local_shape_and_offset(t)
    if shape != tuple(local.shape):
        raise ValueError(
            "DTensor '%s': its placements %s on mesh %s give a local piece of shape %s, but the "
            "local tensor has shape %s; zcc cannot tell where the piece lies in the global tensor"
            % (name, t.placements, tuple(t.device_mesh.shape), shape, tuple(local.shape)))
    return Piece(local, list(t.shape), list(offset), _replica_members(t, rank))


def gather_members(pieces, rank, world_size):
    """`pieces` ((name, Piece) list) as a Piece list, with the members of every DTensor piece found
    over the default process group: the ranks that hold a piece of the same
    name, place and shape. A DTensor on a sub-mesh (fully_shard over the "dp"
    dimension of a dp x tp mesh) is replicated over the ranks outside its
    mesh too, which its placements cannot tell. Without a process group the
    mesh's own account stands. Collective: every rank calls it."""
    dist = torch.distributed
    if world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return [p for _, p in pieces]
    keys = [(name, tuple(p.offset), tuple(p.local.shape)) if p.global_shape is not None else None
            for name, p in pieces]

    def all_gather_object(mine):
        everyone = [None] * world_size
        dist.all_gather_object(everyone, mine)
        return everyone

    found = _layout.holders([k for k in keys if k is not None], all_gather_object, world_size)
    return [p if k is None else p._replace(members=found[k])
            for k, (_, p) in zip(keys, pieces)]


def refuse_fsdp1(model):
    """FSDP1 flattens parameters into FlatParameters whose names and shapes are
    not the model's: refuse them with what to do instead."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover
        return
    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        raise ValueError(
            "the model is wrapped in FullyShardedDataParallel (FSDP1), whose flat parameters are "
            "not the model's tensors; shard it with torch.distributed.fsdp.fully_shard (FSDP2), "
            "whose DTensor parameters zcc checkpoints under the model's own names")


def unwrap(model):
    """The module whose names are the model's state-dict keys: DDP's .module,
    torch.compile's ._orig_mod."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, torch.nn.Module):
            model = model._orig_mod
        else:
            return model
