"""Plain data for zcc.torch's EXTRA blobs: what may be stored (None, bool,
int, float, str, bytes and lists, tuples, dicts and sets of them), a loader
that refuses everything else (restoring never runs code from a checkpoint),
the fixed-size blob a Checkpointer registers, and tensor-valued optimizer
hyperparameters written as plain data and put back in place."""

import io
import pickle

import numpy
import torch

import zcc

_PLAIN_SCALARS = (type(None), bool, int, float, str, bytes)
_LEN_BYTES = 8


_PLAIN_SCALAR_TYPES = frozenset(_PLAIN_SCALARS)
_SEQUENCES = (list, tuple, set, frozenset)


def check_plain(value, where):
    """Raises TypeError unless `value` is plain data the safe loader accepts,
    naming where the first value that is not lies. Exact types: a subclass
    (an OrderedDict, an IntEnum) pickles as its class, which the loader would
    refuse at restore."""
    kind = type(value)
    if kind in _PLAIN_SCALAR_TYPES:
        return
    if kind in _SEQUENCES:
        if _PLAIN_SCALAR_TYPES.issuperset(map(type, value)):
            return
        for i, v in enumerate(value):
            check_plain(v, "%s[%d]" % (where, i))
        return
    if kind is dict:
        for k, v in value.items():
            check_plain(k, "%s key" % where)
            check_plain(v, "%s[%r]" % (where, k))
        return
    raise TypeError("%s is a %s; zcc stores only plain data (None, bool, int, float, str, bytes "
                    "and lists/tuples/dicts/sets of them)" % (where, type(value).__name__))


class _PlainPickler(pickle.Pickler):
    """Pickles plain data only. The C pickler writes None, bool, int, float,
    str, bytes, list, tuple, set, frozenset and dict (exact types) itself and
    asks reducer_override about everything else: refused, so nothing the
    loader below would refuse is ever written, checked at C speed."""

    def reducer_override(self, obj):
        raise TypeError("not plain data: %s" % type(obj).__name__)


def dumps_plain(value, where):
    """`value` pickled, or TypeError naming the first value that is not plain."""
    out = io.BytesIO()
    try:
        _PlainPickler(out, protocol=4).dump(value)
    except TypeError:
        check_plain(value, where)  # says where
        raise
    return out.getvalue()


def part_sizes(parts):
    """"name N bytes, ..." of a dict's pickled parts, largest first, nested
    dicts under "state" by their own names (to say which part outgrew a blob)."""
    sizes = []
    for name, value in parts.items():
        if name == "state" and type(value) is dict:
            sizes += [("state " + n, len(dumps_plain(v, n))) for n, v in value.items()]
        else:
            sizes.append((name, len(dumps_plain(value, name))))
    return ", ".join("%s %d bytes" % (n, b) for n, b in sorted(sizes, key=lambda x: -x[1]))


class PlainUnpickler(pickle.Unpickler):
    """Loads plain data only: no class or function is ever looked up."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError("zcc state holds only plain data; refusing %s.%s" % (module, name))


_PAGE = 4096


class Blob:
    """A fixed-size uint8 tensor registered as EXTRA: 8-byte length + pickle."""

    def __init__(self, name, capacity):
        self.name = name
        self.tensor = torch.zeros(capacity, dtype=torch.uint8)
        self._view = self.tensor.numpy()  # shares memory
        self._bytes = memoryview(self._view)  # byte copies without NumPy's per-call work

    @classmethod
    def sized_for(cls, name, value, minimum):
        """A Blob for `value` and what it grows into: twice its pickle, in
        whole pages, and at least `minimum` bytes. Raises TypeError now for
        what cannot be stored at all."""
        need = len(dumps_plain(value, name)) + _LEN_BYTES
        return cls(name, max(int(minimum), -(-2 * need // _PAGE) * _PAGE))

    def write(self, value):
        payload = dumps_plain(value, self.name)
        need = len(payload) + _LEN_BYTES
        if need > len(self._view):
            raise ValueError("zcc state '%s' needs %d bytes; its buffer holds %d, sized when the "
                             "Checkpointer was built (twice the state then, at least extra_bytes): "
                             "pass Checkpointer(extra_bytes=%d) or more; this step was not "
                             "snapshotted" % (self.name, need, len(self._view),
                                              -(-2 * need // _PAGE) * _PAGE))
        self._bytes[:_LEN_BYTES] = len(payload).to_bytes(_LEN_BYTES, "little")
        self._bytes[_LEN_BYTES:need] = payload

    def read(self):
        n = int.from_bytes(self._view[:_LEN_BYTES].tobytes(), "little")
        if n == 0:
            return None
        if n > len(self._view) - _LEN_BYTES:
            raise zcc.DataLossError("zcc state '%s' holds a bad length %d" % (self.name, n))
        return PlainUnpickler(io.BytesIO(self._view[_LEN_BYTES:_LEN_BYTES + n].tobytes())).load()


_TENSOR_TAG = "__zcc_tensor__"
_NDARRAY_TAG = "__zcc_ndarray__"


def plain_hyperparameter(value):
    """A param_group value as plain data: tensors (PyTorch 2.x accepts a
    tensor lr, and betas of tensors) become tagged (dtype, shape, bytes)."""
    if type(value) in _PLAIN_SCALAR_TYPES:  # most values: nothing to do
        return value
    if torch.is_tensor(value):
        t = value.detach().cpu().contiguous()
        return {_TENSOR_TAG: (str(t.dtype).replace("torch.", ""), list(t.shape),
                              t.reshape(-1).view(torch.uint8).numpy().tobytes())}
    if isinstance(value, numpy.ndarray):
        a = numpy.ascontiguousarray(value)
        return {_NDARRAY_TAG: (a.dtype.str, list(a.shape), a.tobytes())}
    if isinstance(value, numpy.generic):  # a NumPy scalar: its Python value
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(plain_hyperparameter(v) for v in value)
    if isinstance(value, dict):
        return {k: plain_hyperparameter(v) for k, v in value.items()}
    return value


@torch.no_grad()
def restore_hyperparameter(current, saved):
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
    if isinstance(saved, dict) and set(saved) == {_NDARRAY_TAG}:
        dtype, shape, raw = saved[_NDARRAY_TAG]
        if numpy.dtype(dtype).hasobject:
            raise zcc.DataLossError("zcc state holds an array of Python objects")
        return numpy.frombuffer(raw, dtype=numpy.dtype(dtype)).reshape(shape).copy()
    if isinstance(saved, (list, tuple)):
        currents = current if isinstance(current, (list, tuple)) and len(current) == len(saved) \
            else [None] * len(saved)
        return type(saved)(restore_hyperparameter(c, v) for c, v in zip(currents, saved))
    if isinstance(saved, dict):
        currents = current if isinstance(current, dict) else {}
        return {k: restore_hyperparameter(currents.get(k), v) for k, v in saved.items()}
    return saved
