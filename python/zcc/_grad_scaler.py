"""The loss scaler of fp16 mixed precision as a Checkpointer's `state` (the
integrations: zcc.accelerate, zcc.hf, zcc.lightning).

A torch GradScaler's state (its scale and growth tracker) is part of the
training state: a run resumed without it starts again from the initial scale
(2**16), skipping steps as overflows until it has backed off, and grows the
scale at other steps than the uninterrupted run. Reading it (state_dict)
reads the scale from the device: under fp16 each snapshot waits for the
optimizer step's kernels, as GradScaler.step already waits for its overflow
check. A disabled scaler (bf16, fp32) has no state and is left out."""

GRAD_SCALER = "grad_scaler"  # its name among the Checkpointer's `state`


def add_grad_scaler(state, scaler):
    """`state` (a dict of Stateful objects) with `scaler` under GRAD_SCALER
    where it is a GradScaler that scales; ValueError where the name is
    taken."""
    if scaler is None:
        return state
    enabled = getattr(scaler, "is_enabled", None)
    if callable(enabled) and not enabled():
        return state
    if GRAD_SCALER in state:
        raise ValueError("state already has a %r" % GRAD_SCALER)
    state[GRAD_SCALER] = scaler
    return state
