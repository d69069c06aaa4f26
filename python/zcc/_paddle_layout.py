"""How zcc.paddle describes a Paddle tensor to zcc: a DistTensor's piece of
its global tensor, and which optimizer under Paddle's sharding wrappers
holds the state.

A DistTensor (``dist.shard_tensor`` on a ``ProcessMesh``, auto-parallel)
says where its local value lies: every ``Shard(dim)`` of its placements
cuts the global tensor along ``dim`` into chunks of ceil(size / parts)
elements (the last ones shorter or empty), and every ``Replicate()`` names a
mesh dimension whose ranks hold the same piece. zcc registers the local
value, the memory Paddle updates in place, as that box of the global tensor.

Fleet's sharding stage 1 (``DygraphShardingOptimizer``, under
``HybridParallelOptimizer``; stage 2 keeps the same optimizer state) gives
each sharding rank the whole optimizer state of the parameters it owns and
none of the others': each accumulator is a whole tensor held by its owner
and the owner's data-parallel replicas, found by gathering every rank's
accumulator names.
"""

import numpy

from zcc import _layout
from zcc._layout import Piece


def is_dist(t):
    return getattr(t, "is_dist", None) is not None and t.is_dist()


def local_of(t):
    """The memory zcc copies: a DistTensor's local value, else the tensor."""
    return t._local_value() if is_dist(t) else t


def piece_of(name, t, rank):
    """The Piece of tensor `t` (named `name`, for errors): a DistTensor's
    box and the ranks holding it by its mesh, else the whole tensor with
    members None (the Checkpointer's replica group says them)."""
    if not is_dist(t):
        return Piece(t, None, None, None)
    placements = list(t.placements)
    mesh = t.process_mesh
    cut = {}
    for i, p in enumerate(placements):
        if p.is_partial():
            raise ValueError(
                "DistTensor '%s' has a Partial placement on mesh dimension %d: its local values "
                "are not the tensor's until they are reduced; zcc checkpoints Shard and Replicate "
                "placements only (reshard it first)" % (name, i))
        if p.is_shard():
            if p.get_split_factor() != 1:
                raise ValueError("DistTensor '%s' is sharded with split factor %d on mesh "
                                 "dimension %d; zcc checkpoints plain Shard(dim) placements"
                                 % (name, p.get_split_factor(), i))
            if p.get_dim() in cut:
                raise ValueError(
                    "DistTensor '%s' cuts tensor dimension %d on mesh dimensions %d and %d; zcc "
                    "checkpoints one cut per tensor dimension" % (name, p.get_dim(), cut[p.get_dim()], i))
            cut[p.get_dim()] = i
        elif not p.is_replicated():
            raise ValueError("DistTensor '%s' has placement %s; zcc checkpoints Shard and "
                             "Replicate placements only" % (name, p))
    ids = [int(r) for r in mesh.process_ids]
    if rank not in ids:
        raise ValueError("DistTensor '%s' lives on ranks %s, not on this rank (%d)"
                         % (name, ids, rank))
    mesh_shape = [int(n) for n in mesh.shape]
    coordinate = [int(c) for c in numpy.unravel_index(ids.index(rank), mesh_shape)]
    shape, offset = _layout.chunk_box(
        [int(n) for n in t.shape], mesh_shape, coordinate,
        [p.get_dim() if p.is_shard() else None for p in placements])
    local = t._local_value()
    if shape != tuple(int(n) for n in local.shape):
        raise ValueError(
            "DistTensor '%s': its placements %s on mesh %s give a local piece of shape %s, but "
            "its local value has shape %s; zcc cannot tell where the piece lies in the global "
            "tensor" % (name, placements, mesh_shape, list(shape), list(local.shape)))
    nested = numpy.array(ids).reshape(mesh_shape).tolist()
    members = _layout.mesh_members(
        nested, coordinate, {i for i, p in enumerate(placements) if p.is_replicated()})
    return Piece(local, [int(n) for n in t.shape], list(offset), members)


def inner_optimizer(optimizer, base_class):
    """(the `base_class` optimizer under Paddle's wrappers, whether its state
    is sharded by parameter ownership). Refuses the wrappers whose state is
    not the model's tensors."""
    sharded = False
    opt = optimizer
    while not isinstance(opt, base_class):
        kind = type(opt).__name__
        if kind == "DygraphShardingOptimizerV2":
            raise ValueError(
                "the optimizer is fleet's sharding with split_param (DygraphShardingOptimizerV2), "
                "whose state lives in flattened slices across ranks; zcc.paddle checkpoints "
                "sharding stage 1 without split_param (DygraphShardingOptimizer)")
        if kind == "DygraphShardingOptimizer":
            if getattr(opt, "tensor_fusion", False) or getattr(opt, "comm_overlap", False):
                raise ValueError(
                    "the sharding optimizer fuses parameters (tensor_fusion or comm_overlap), so "
                    "its state is kept for fused buffers, not for the model's parameters; turn "
                    "both off in sharding_configs to checkpoint it with zcc.paddle")
            sharded = True
        inner = getattr(opt, "_inner_opt", None)
        if inner is None:
            raise TypeError("optimizer %s is neither a paddle.optimizer.Optimizer nor a fleet "
                            "wrapper of one" % kind)
        opt = inner
    if type(opt).__name__ in ("GroupShardedOptimizerStage2",):
        raise ValueError(
            "group_sharded_parallel's optimizer (GroupShardedOptimizerStage2) is not supported: "
            "zcc.paddle checkpoints fleet's sharding stage 1 (DygraphShardingOptimizer, "
            "fleet.distributed_optimizer with sharding_degree > 1)")
    return opt, sharded
