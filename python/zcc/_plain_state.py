"""Plain data for the Checkpointers' EXTRA blobs (zcc.torch, zcc.paddle):
what may be stored (None, bool, int, float, str, bytes and lists, tuples,
dicts and sets of them; tensors, NumPy arrays and numbers and container
subclasses, which the pickler writes as plain data), a loader that refuses
everything else but the builtin containers and numbers those are rebuilt
with (restoring never runs code from a checkpoint), the fixed-size blob a
Checkpointer registers, and tensors in state (optimizer hyperparameters, a
data loader's state dict) put back in place. Framework-neutral: a
framework's tensors go through its TensorCodec."""

import io
import pickle

import numpy

import zcc

_PLAIN_SCALARS = (type(None), bool, int, float, str, bytes)
_LEN_BYTES = 8


_PLAIN_SCALAR_TYPES = frozenset(_PLAIN_SCALARS)
_SEQUENCES = (list, tuple, set, frozenset)
# The only globals a state pickle names: the containers and numbers that
# tensors, arrays, NumPy scalars and container subclasses are written as.
# Called on plain arguments they run no code of the checkpoint's choosing.
_REBUILDERS = {"dict": dict, "list": list, "tuple": tuple, "set": set, "frozenset": frozenset,
               "int": int, "float": float, "bool": bool}
_REBUILDER_TYPES = frozenset(_REBUILDERS.values())

_TENSOR_TAG = "__zcc_tensor__"
_NDARRAY_TAG = "__zcc_ndarray__"


def _plain_reduction(obj, codec):
    """How _StatePickler writes what is not an exact plain type: `codec`'s
    tensors and NumPy arrays as tagged (dtype, shape, bytes) dicts, NumPy
    scalars as Python numbers, subclasses of dict, list, tuple, set and
    frozenset as those; TypeError for anything else."""
    if codec is not None and codec.is_tensor(obj):
        return dict, ([(_TENSOR_TAG, codec.to_plain(obj))],)
    if isinstance(obj, numpy.ndarray):
        a = numpy.ascontiguousarray(obj)
        if not a.dtype.hasobject:
            return dict, ([(_NDARRAY_TAG, (a.dtype.str, list(a.shape), a.tobytes()))],)
    elif isinstance(obj, numpy.generic):
        v = obj.item()
        if type(v) in (bool, int, float):
            return type(v), (v,)
    elif isinstance(obj, dict):
        return dict, (list(obj.items()),)
    elif isinstance(obj, _SEQUENCES):
        base = next(b for b in _SEQUENCES if isinstance(obj, b))
        return base, (base(obj),)
    elif isinstance(obj, type) and obj in _REBUILDER_TYPES:  # (the rebuilders above: by name)
        return NotImplemented
    raise TypeError("not plain data: %s" % type(obj).__name__)


def _storable(value, codec):
    """Whether _plain_reduction writes `value` itself (not its items)."""
    kind = type(value)
    if kind in _PLAIN_SCALAR_TYPES or (codec is not None and codec.is_tensor(value)):
        return True
    if isinstance(value, numpy.ndarray):
        return not value.dtype.hasobject
    if isinstance(value, numpy.generic):
        return type(value.item()) in (bool, int, float)
    return False


def check_plain(value, where, codec=None):
    """Raises TypeError unless `value` can be stored (plain data, `codec`'s
    tensors, NumPy arrays and numbers, and containers of them), naming where
    the first value that cannot lies. A subclass of a number or a string (an
    IntEnum) is refused: it would come back as another type."""
    if _storable(value, codec):
        return
    if isinstance(value, dict):
        for k, v in value.items():
            check_plain(k, "%s key" % where, codec)
            check_plain(v, "%s[%r]" % (where, k), codec)
        return
    if isinstance(value, _SEQUENCES):
        for i, v in enumerate(value):
            check_plain(v, "%s[%d]" % (where, i), codec)
        return
    raise TypeError("%s is a %s; zcc stores only plain data (None, bool, int, float, str, bytes "
                    "and lists/tuples/dicts/sets of them), tensors and NumPy arrays"
                    % (where, type(value).__name__))


class _StatePickler(pickle.Pickler):
    """The C pickler writes None, bool, int, float, str, bytes, list, tuple,
    set, frozenset and dict (exact types) itself, at C speed, and asks
    reducer_override about everything else (_plain_reduction): nothing the
    loader below would refuse is ever written, and state needs no walk in
    Python before it is pickled."""

    def __init__(self, file, codec):
        super().__init__(file, protocol=4)
        self._codec = codec

    def reducer_override(self, obj):
        return _plain_reduction(obj, self._codec)


class StateDumper:
    """Pickles state again and again with one pickler and one buffer."""

    def __init__(self, codec=None):
        self._out = io.BytesIO()
        self._pickler = _StatePickler(self._out, codec)
        self._codec = codec

    def dumps(self, value, where):
        """`value` pickled, or TypeError naming the first value that cannot be."""
        out = self._out
        out.seek(0)
        out.truncate()
        self._pickler.clear_memo()
        try:
            self._pickler.dump(value)
        except TypeError:
            check_plain(value, where, self._codec)  # says where
            raise
        return out.getvalue()


def dumps_plain(value, where, codec=None):
    """`value` pickled (StateDumper.dumps), or TypeError naming where it cannot be."""
    return StateDumper(codec).dumps(value, where)


def part_sizes(parts, codec=None):
    """"name N bytes, ..." of a dict's pickled parts, largest first, nested
    dicts under "state" by their own names (to say which part outgrew a blob)."""
    sizes = []
    for name, value in parts.items():
        if name == "state" and type(value) is dict:
            sizes += [("state " + n, len(dumps_plain(v, n, codec))) for n, v in value.items()]
        else:
            sizes.append((name, len(dumps_plain(value, name, codec))))
    return ", ".join("%s %d bytes" % (n, b) for n, b in sorted(sizes, key=lambda x: -x[1]))


class PlainUnpickler(pickle.Unpickler):
    """Loads plain data only: no class or function is looked up but the
    builtin containers and numbers _plain_reduction writes."""

    def find_class(self, module, name):
        if module == "builtins" and name in _REBUILDERS:
            return _REBUILDERS[name]
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

    def __init__(self, name, capacity, codec=None):
        self.name = name
        self.array = numpy.zeros(capacity, dtype=numpy.uint8)
        self._bytes = memoryview(self.array)  # byte copies without NumPy's per-call work
        self._dumper = StateDumper(codec)

    @classmethod
    def sized_for(cls, name, value, minimum, codec=None):
        """A Blob for `value` and what it grows into: twice its pickle, in
        whole pages, and at least `minimum` bytes. Raises TypeError now for
        what cannot be stored at all."""
        need = len(dumps_plain(value, name, codec)) + _LEN_BYTES
        return cls(name, max(int(minimum), blob_bytes(need)), codec)

    def write(self, value):
        """Writes `value`; BlobOutgrown when it needs more room than this
        blob has (nothing is written then)."""
        self.write_payload(self._dumper.dumps(value, self.name))

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


def restore_hyperparameter(current, saved, codec=None):
    """`saved` (as a Blob read it back) as the value to put where
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
