"""PyTorch tensors in zcc.torch's plain state (_plain_state.TensorCodec):
tensor-valued optimizer hyperparameters, tensors in a Stateful's state dict."""

import torch

from zcc import _plain_state


class TorchCodec(_plain_state.TensorCodec):
    def is_tensor(self, value):
        return torch.is_tensor(value)

    def to_plain(self, tensor):
        t = tensor.detach().cpu().contiguous()
        return (str(t.dtype).replace("torch.", ""), list(t.shape),
                t.reshape(-1).view(torch.uint8).numpy().tobytes())

    @torch.no_grad()
    def from_plain(self, current, dtype, shape, raw):
        t = torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(shape) \
            if raw else torch.empty(shape, dtype=getattr(torch, dtype))
        if torch.is_tensor(current) and current.shape == t.shape and current.dtype == t.dtype:
            current.copy_(t)
            return current
        return t


CODEC = TorchCodec()
