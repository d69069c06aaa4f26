"""PyTorch tensors in zcc.torch's plain state (_plain_state.TensorCodec):
tensor-valued optimizer hyperparameters, tensors in a Stateful's state dict."""

import ctypes

import torch

from zcc import _plain_state

_DTYPE_NAMES = {}  # torch.float32 -> "float32"


class TorchCodec(_plain_state.TensorCodec):
    def is_tensor(self, value):
        return torch.is_tensor(value)

    def to_plain(self, tensor):
        # The bytes read at the data pointer: a snapshot pays for this (a
        # data loader's generator state), and each torch call costs more
        # than the copy.
        t = tensor
        if t.device.type != "cpu" or not t.is_contiguous():
            t = t.detach().cpu().contiguous()
        name = _DTYPE_NAMES.get(t.dtype)
        if name is None:
            name = _DTYPE_NAMES[t.dtype] = str(t.dtype).replace("torch.", "")
        n = t.nbytes
        return name, list(t.shape), ctypes.string_at(t.data_ptr(), n) if n else b""

    @torch.no_grad()
    def from_plain(self, current, dtype, shape, raw):
        t = torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(shape) \
            if raw else torch.empty(shape, dtype=getattr(torch, dtype))
        if torch.is_tensor(current) and current.shape == t.shape and current.dtype == t.dtype:
            current.copy_(t)
            return current
        return t


CODEC = TorchCodec()
