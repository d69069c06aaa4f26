"""Pieces of global tensors and the replica groups of the ranks holding them,
framework-neutral: what zcc.torch (DTensors) and zcc.paddle (DistTensors,
sharded optimizer state) both describe to zcc.

A rank registers a piece: a box of a global tensor (its shape and its
offset per dimension), or a whole tensor. The ranks holding the same piece
are its members; zcc has it written (and read back) by one of them.

zcc keys a rank's replica groups by kind and id, one group per key: the
group of the whole job is the data-parallel group; every other set of ranks
sharing pieces (a tensor-parallel group sharing its layer norms, the
data-parallel replicas of one sharding rank's optimizer state) is a group of
kind ``expert_data_parallel`` whose id is derived from its members, from
2**31 up (real expert ids stay below).
"""

import collections
import zlib

import zcc

_SYNTHETIC_GROUP_BASE = 1 << 31

# A piece of a global tensor as this rank holds it.
#   local:        the tensor zcc copies (contiguous)
#   global_shape: the global tensor's shape, or None for a whole tensor
#   offset:       where the piece starts in it, per dimension, or None
#   members:      the global ranks holding this same piece, sorted; None
#                 for a whole tensor whose replicas the Checkpointer's
#                 `replica` argument says
Piece = collections.namedtuple("Piece", "local global_shape offset members")


def chunk_box(global_shape, mesh_shape, coordinate, shard_dims):
    """(shape, offset) of the box a mesh coordinate holds when mesh dimension
    i cuts tensor dimension shard_dims[i] (None: replicated along it) into
    mesh_shape[i] chunks of ceil(size / parts) elements, the last ones
    shorter or empty (torch.chunk's rule, which PyTorch's and Paddle's
    Shard placements follow). Mesh dimensions apply in order: a second cut
    of the same tensor dimension cuts the first one's chunk."""
    shape = list(global_shape)
    offset = [0] * len(shape)
    for parts, index, dim in zip(mesh_shape, coordinate, shard_dims):
        if dim is None:
            continue
        chunk = -(-shape[dim] // parts)
        start = min(chunk * index, shape[dim])
        offset[dim] += start
        shape[dim] = max(0, min(chunk, shape[dim] - start))
    return tuple(shape), tuple(offset)


def mesh_members(mesh_ids, coordinate, replicated):
    """The ranks of an N-d mesh (`mesh_ids`: nested lists of ranks) whose
    coordinates equal `coordinate` on every dimension not in `replicated`."""
    def walk(level, dim):
        if dim == len(coordinate):
            return [level]
        picks = range(len(level)) if dim in replicated else [coordinate[dim]]
        return [r for i in picks for r in walk(level[i], dim + 1)]
    return tuple(sorted(int(r) for r in walk(mesh_ids, 0)))


def holders(keys, all_gather_object, world_size):
    """{key: sorted ranks} of every rank's `keys` (hashable, picklable),
    gathered with `all_gather_object(obj) -> [obj of each rank]`.
    Collective: every rank calls it."""
    everyone = all_gather_object(list(keys))
    if len(everyone) != world_size:
        raise zcc.FailedPreconditionError(
            "the process group has %d ranks and the Checkpointer's world size is %d"
            % (len(everyone), world_size))
    found = collections.defaultdict(list)
    for r, theirs in enumerate(everyone):
        for k in theirs:
            found[tuple(k) if isinstance(k, list) else k].append(r)
    return {k: tuple(v) for k, v in found.items()}


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
