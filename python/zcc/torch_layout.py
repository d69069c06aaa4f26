"""How zcc.torch describes a tensor of a PyTorch model to zcc: which piece of
which global tensor this rank holds, and which ranks hold the same piece.

A plain tensor is the whole tensor; whether other ranks hold copies of it is
the Checkpointer's ``replica`` argument (DDP: every rank). A DTensor (FSDP2's
``fully_shard``, tensor parallelism's ``parallelize_module``, or both on a 2-D
mesh) says both itself: every ``Shard(dim)`` of its placements cuts its global
tensor along ``dim`` (unevenly where the size does not divide: PyTorch's
``torch.chunk`` rule), so the local tensor is a box of the global one, and
every ``Replicate()`` names a mesh dimension whose ranks hold the same box.

Replicas become zcc replica groups, which have the piece written (and read
back) by one member. zcc keys a rank's groups by kind and id, one group per
key: the group of the whole job is the data-parallel group; every other set
of ranks sharing pieces (a tensor-parallel group sharing its layer norms under
FSDP2 x TP, say) is a group of kind ``expert_data_parallel`` whose id is
derived from its members, from 2**31 up (real expert ids stay below).
"""

import collections
import zlib

import torch

import zcc

try:  # public from PyTorch 2.5 (2.4: torch.distributed._tensor)
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - PyTorch without distributed
    DTensor = None

_SYNTHETIC_GROUP_BASE = 1 << 31

# A piece of a global tensor as this rank holds it.
#   local:        the tensor zcc copies (contiguous)
#   global_shape: the global tensor's shape, or None for a whole tensor
#   offset:       where the piece starts in it, per dimension, or None
#   members:      the global ranks holding this same piece, sorted
Piece = collections.namedtuple("Piece", "local global_shape offset members")


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
    shape = list(t.shape)
    offset = [0] * len(shape)
    for mesh_dim, p in enumerate(t.placements):
        if p.is_shard():
            parts = mesh.size(mesh_dim)
            chunk = -(-shape[p.dim] // parts)
            start = min(chunk * mesh.get_local_rank(mesh_dim), shape[p.dim])
            offset[p.dim] += start
            shape[p.dim] = max(0, min(chunk, shape[p.dim] - start))
    return tuple(shape), tuple(offset)


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
    everyone = [None] * world_size
    dist.all_gather_object(everyone, [k for k in keys if k is not None])
    holders = collections.defaultdict(list)
    for r, theirs in enumerate(everyone):
        for k in theirs:
            holders[k].append(r)
    return [p if k is None else p._replace(members=tuple(holders[k]))
            for k, (_, p) in zip(keys, pieces)]


def replica_groups(members_list, rank, world_size):
    """{members: zcc.ReplicaGroup} for the distinct member sets of one rank's
    pieces, by the rule in the module docstring. Every member of a set
    derives the same group from it."""
    world = tuple(range(world_size))
    groups = {}
    synthetic = {}
    for members in members_list:
        if members in groups:
            continue
        if len(members) <= 1:
            groups[members] = zcc.ReplicaGroup()
            continue
        if rank not in members:
            raise ValueError("rank %d holds a piece whose replicas are ranks %s" % (rank, members))
        if members == world:
            groups[members] = zcc.ReplicaGroup("data_parallel", len(members), members.index(rank))
            continue
        key = zlib.crc32(repr(members).encode()) & (_SYNTHETIC_GROUP_BASE - 1)
        if key in synthetic:  # two sets of ranks with one crc: cannot key both
            raise ValueError("replica groups %s and %s collide; give the Checkpointer "
                             "replica='none' and distinct names" % (synthetic[key], members))
        synthetic[key] = members
        groups[members] = zcc.ReplicaGroup("expert_data_parallel", len(members),
                                           members.index(rank),
                                           expert_id=_SYNTHETIC_GROUP_BASE + key)
    return groups


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
