"""Plain data for the Checkpointers' EXTRA blobs (zcc.torch, zcc.paddle):
what may be stored (None, bool, int, float, str, bytes and lists, tuples,
dicts and sets of them), a loader that refuses everything else (restoring
never runs code from a checkpoint), the fixed-size blob a Checkpointer
registers, and tensors in state (optimizer hyperparameters, a data loader's
state dict) written as plain data and put back in place. Framework-neutral:
a framework's tensors go through its TensorCodec."""

import io
import pickle

import numpy

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


class BlobOutgrown(ValueError):
    """A Blob's value needs more bytes than it holds: `need` (the pickle
    and its length) and the pickle itself, to write into a larger one."""

    def __init__(self, message, need, payload):
        super().__init__(message)
        self.need = need
        self.payload = payload


def blob_bytes(need):
    """What a blob for `need` bytes is sized to: twice that, in whole pages."""
    return -(-2 * int(need) // _PAGE) * _PAGE


class Blob:
    """A fixed-size uint8 array registered as EXTRA: 8-byte length + pickle."""

    def __init__(self, name, capacity):
        self.name = name
        self.array = numpy.zeros(capacity, dtype=numpy.uint8)
        self._bytes = memoryview(self.array)  # byte copies without NumPy's per-call work

    @classmethod
    def sized_for(cls, name, value, minimum):
        """A Blob for `value` and what it grows into: twice its pickle, in
        whole pages, and at least `minimum` bytes. Raises TypeError now for
        what cannot be stored at all."""
        need = len(dumps_plain(value, name)) + _LEN_BYTES
        return cls(name, max(int(minimum), blob_bytes(need)))

    def write(self, value):
        """Writes `value`; BlobOutgrown when it needs more room than this
        blob has (nothing is written then)."""
        self.write_payload(dumps_plain(value, self.name))

    def write_payload(self, payload):
        need = len(payload) + _LEN_BYTES
        if need > len(self.array):
            raise BlobOutgrown("zcc state '%s' needs %d bytes; its buffer holds %d"
                               % (self.name, need, len(self.array)), need, payload)
        self._bytes[:_LEN_BYTES] = len(payload).to_bytes(_LEN_BYTES, "little")
        self._bytes[_LEN_BYTES:need] = payload

    def read(self):
        n = int.from_bytes(self.array[:_LEN_BYTES].tobytes(), "little")
        if n == 0:
            return None
        if n > len(self.array) - _LEN_BYTES:
            raise zcc.DataLossError("zcc state '%s' holds a bad length %d" % (self.name, n))
        return PlainUnpickler(io.BytesIO(self.array[_LEN_BYTES:_LEN_BYTES + n].tobytes())).load()


_TENSOR_TAG = "__zcc_tensor__"
_NDARRAY_TAG = "__zcc_ndarray__"


class TensorCodec:
    """How a framework's tensors are written as plain data and read back
    (zcc.torch's and zcc.paddle's): a tensor becomes (dtype name, shape,
    bytes) under a tag."""

    def is_tensor(self, value):
        raise NotImplementedError

    def to_plain(self, tensor):
        """(dtype name, shape list, raw bytes) of a tensor."""
        raise NotImplementedError

    def from_plain(self, current, dtype, shape, raw):
        """The saved tensor: written into `current` in place when it is a
        tensor of that dtype and shape (whatever holds it then sees the
        restored value), else a new one."""
        raise NotImplementedError


def plain_hyperparameter(value, codec=None):
    """`value` as plain data: `codec`'s tensors (PyTorch 2.x accepts a tensor
    lr, and betas of tensors) and NumPy arrays become tagged (dtype, shape,
    bytes), NumPy scalars their Python values."""
    if type(value) in _PLAIN_SCALAR_TYPES:  # most values: nothing to do
        return value
    if codec is not None and codec.is_tensor(value):
        return {_TENSOR_TAG: codec.to_plain(value)}
    if isinstance(value, numpy.ndarray):
        a = numpy.ascontiguousarray(value)
        return {_NDARRAY_TAG: (a.dtype.str, list(a.shape), a.tobytes())}
    if isinstance(value, numpy.generic):  # a NumPy scalar: its Python value
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(plain_hyperparameter(v, codec) for v in value)
    if isinstance(value, dict):
        return {k: plain_hyperparameter(v, codec) for k, v in value.items()}
    return value


def restore_hyperparameter(current, saved, codec=None):
    """`saved` (from plain_hyperparameter) as the value to put where
    `current` is: a tensor is filled in place by `codec`, so whatever holds
    it (a scheduler, a fused kernel) sees the restored value."""
    if isinstance(saved, dict) and set(saved) == {_TENSOR_TAG}:
        if codec is None:
            raise zcc.FailedPreconditionError("zcc state holds a tensor and no framework reads it")
        dtype, shape, raw = saved[_TENSOR_TAG]
        return codec.from_plain(current, dtype, list(shape), raw)
    if isinstance(saved, dict) and set(saved) == {_NDARRAY_TAG}:
        dtype, shape, raw = saved[_NDARRAY_TAG]
        if numpy.dtype(dtype).hasobject:
            raise zcc.DataLossError("zcc state holds an array of Python objects")
        return numpy.frombuffer(raw, dtype=numpy.dtype(dtype)).reshape(shape).copy()
    if isinstance(saved, (list, tuple)):
        currents = current if isinstance(current, (list, tuple)) and len(current) == len(saved) \
            else [None] * len(saved)
        return type(saved)(restore_hyperparameter(c, v, codec) for c, v in zip(currents, saved))
    if isinstance(saved, dict):
        currents = current if isinstance(current, dict) else {}
        return {k: restore_hyperparameter(currents.get(k), v, codec) for k, v in saved.items()}
    return saved
