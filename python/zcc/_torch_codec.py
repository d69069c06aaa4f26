"""PyTorch tensors in zcc.torch's plain state (_plain_state.TensorCodec):
tensor-valued optimizer hyperparameters, tensors in a Stateful's state dict."""

import ctypes
import weakref

import torch

from zcc import _plain_state
from zcc import _zcc

_DTYPE_NAMES = {}  # torch.float32 -> "float32"

# Tensors written again unchanged are served from what was written
# (TorchCodec.to_plain): at most this many, of at most this many bytes each.
_SEEN_TENSORS = 32
_SEEN_BYTES = 1 << 20


class TorchCodec(_plain_state.TensorCodec):
    def __init__(self):
        # id -> (tensor, its _version, its shape, MemoryWatch of its bytes, plain)
        self._seen = {}
        # id -> weak reference: tensors written once. A state may hand back a
        # fresh tensor at every step (Generator.get_state()): such a tensor
        # is neither watched (a copy of its bytes) nor kept alive.
        self._sighted = {}

    def is_tensor(self, value):
        return torch.is_tensor(value)

    def to_plain(self, tensor):
        # Every snapshot pays for this (a data loader's sampler hands back the
        # same generator-state tensor at every step), and each torch call
        # costs more than the copy: the bytes are read at the data pointer,
        # and a small CPU tensor written before is served from that unless it
        # moved (another tensor, an in-place change, a new shape, or any byte
        # different, however written: a MemoryWatch compares them).
        key = id(tensor)
        seen = self._seen.get(key)
        if seen is not None and seen[0] is tensor:
            if seen[1] == tensor._version and seen[2] == tensor.shape and not seen[3].changed():
                return seen[4]
            again = True
        else:
            sighted = self._sighted.get(key)
            again = sighted is not None and sighted() is tensor
        t = tensor
        if t.device.type != "cpu" or not t.is_contiguous():
            t = t.detach().cpu().contiguous()
        name = _DTYPE_NAMES.get(t.dtype)
        if name is None:
            name = _DTYPE_NAMES[t.dtype] = str(t.dtype).replace("torch.", "")
        n = t.nbytes
        plain = name, list(t.shape), ctypes.string_at(t.data_ptr(), n) if n else b""
        if t is tensor and 0 < n <= _SEEN_BYTES:
            if again:
                # Handed back a second time: watched from now on.
                self._sighted.pop(key, None)
                if len(self._seen) >= _SEEN_TENSORS and key not in self._seen:
                    self._seen.clear()
                self._seen[key] = (tensor, tensor._version, tensor.shape,
                                   _zcc.MemoryWatch([(tensor, t.data_ptr(), n)]), plain)
            else:
                if len(self._sighted) >= _SEEN_TENSORS:
                    self._sighted.clear()
                self._sighted[key] = weakref.ref(tensor)
        return plain

    @torch.no_grad()
    def from_plain(self, current, dtype, shape, raw):
        t = torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(shape) \
            if raw else torch.empty(shape, dtype=getattr(torch, dtype))
        if torch.is_tensor(current) and current.shape == t.shape and current.dtype == t.dtype:
            current.copy_(t)
            return current
        return t


CODEC = TorchCodec()
