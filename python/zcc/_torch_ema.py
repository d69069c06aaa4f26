"""zccd's EMA of a zcc.torch.Checkpointer's parameters, read back as a
state dict (DTensor parameters' EMA as DTensors placed like them)."""

import collections

import torch

from zcc import torch_layout


class EmaReading:
    """The EMA half of Checkpointer (a mixin: it works on the Checkpointer's
    registration)."""

    def ema_state_dict(self, timeout=30.0, include_buffers=True):
        """zccd's fp32 EMA of the parameters, as {name: float32 tensor}, once it
        includes the last snapshot this client published (waits up to `timeout`;
        warns and returns the EMA as it is after that). With replicas, only the
        parameters whose EMA this rank's zccd keeps. A DTensor parameter's EMA
        is a DTensor of the same placements (an FSDP2 model loads the dict). include_buffers adds the
        model's current buffers so that the result loads with load_state_dict."""
        _, arrays = self._read_ema(timeout)
        names = self._kept_ema_names()
        out = collections.OrderedDict((n, torch.from_numpy(arrays[n])) for n in names)
        for name, p in self._dtensor_params.items():
            # A sharded parameter's EMA as a DTensor placed like it, so that
            # the sharded model loads it (ranks with no rows hold none).
            local = p.to_local()
            if name not in out and local.numel() > 0:
                continue  # another replica keeps it
            piece = out.pop(name, None)
            if piece is None:
                piece = torch.zeros(local.shape, dtype=torch.float32)
            out[name] = torch_layout.DTensor.from_local(
                piece.to(local.device), p.device_mesh, p.placements, run_check=False,
                shape=p.shape, stride=torch.empty(p.shape, device="meta").stride())
        if include_buffers:
            state_keys = set(self.model.state_dict().keys())
            for name, b in self.model.named_buffers():
                if name in state_keys:
                    out[name] = b.detach().clone()
        return out
