"""The optimizer state zcc.torch registers before the optimizer has any:
the layout of the state PyTorch creates lazily at the first step, written
down for Adam, AdamW, SGD and RMSprop, and found for other optimizers by a
probe step whose effects are all undone."""

import torch

from zcc import torch_layout

# The optimizer state PyTorch creates lazily at the first step, written down
# for the optimizers whose layout torch/optim/*.py fixes, so that the
# constructor needs no probe step. Each function maps (optimizer, param group,
# param) to {key: (shape, dtype, device)} of the tensors that step creates, in
# creation order, or None for options it does not cover (the probe then finds
# out). Checked against the probe by binding_test under torch 1.13 and 2.15;
# other major versions are left to the probe.
_TORCH_VERSION = tuple(int(v) for v in torch.__version__.split(".")[:2])
_TORCH_2 = _TORCH_VERSION >= (2, 0)
_LAYOUTS_KNOWN = (1, 13) <= _TORCH_VERSION < (3, 0)
_CPU = torch.device("cpu")


# A state tensor shaped, typed and placed like its parameter (for a DTensor
# parameter, a DTensor of the same placements): torch.zeros_like(param).
LIKE_PARAM = "like_param"


def layout_of(p, v):
    """The layout entry of state tensor `v` of parameter `p`, as found by the probe."""
    if torch_layout.is_dtensor(p) or torch_layout.is_dtensor(v):
        if (torch_layout.is_dtensor(p) and torch_layout.is_dtensor(v) and v.shape == p.shape
                and v.placements == p.placements and v.device_mesh == p.device_mesh):
            return LIKE_PARAM
        raise ValueError("optimizer state of shape %s next to a parameter of shape %s: zcc "
                         "registers DTensor optimizer state shaped and placed like its parameter "
                         "only" % (tuple(v.shape), tuple(p.shape)))
    if v.shape == p.shape and v.dtype == p.dtype and v.device == p.device:
        return LIKE_PARAM
    return (v.shape, v.dtype, v.device)


def empty_state(p, layout):
    if layout == LIKE_PARAM:
        return torch.empty_like(p.detach(), memory_format=torch.contiguous_format)
    shape, dtype, device = layout
    return torch.empty(shape, dtype=dtype, device=device)


def local(t):
    return t.to_local() if torch_layout.is_dtensor(t) else t


def _scalar_step_dtype():
    """The dtype of a CPU `step` tensor: optimizer._get_scalar_dtype() in 2.x,
    the default dtype (``torch.tensor(0.)``) in 1.13."""
    if not _TORCH_2:
        return torch.get_default_dtype()
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _adam_layout(opt, group, p):
    """Adam and AdamW."""
    if _TORCH_2:
        fused = bool(group.get("fused"))
        if group["capturable"] or fused:
            step = ((), torch.float32 if fused else _scalar_step_dtype(), p.device)
        else:
            step = ((), _scalar_step_dtype(), _CPU)
    elif opt.defaults.get("capturable") or opt.defaults.get("fused"):
        return None  # 1.13 reads these from the defaults; GPU-only, left to the probe
    else:
        step = ((), _scalar_step_dtype(), _CPU)
    layout = {"step": step, "exp_avg": LIKE_PARAM, "exp_avg_sq": LIKE_PARAM}
    if group["amsgrad"]:
        layout["max_exp_avg_sq"] = LIKE_PARAM
    return layout


def _sgd_layout(opt, group, p):
    # Without momentum SGD keeps no tensor (1.13 stores momentum_buffer=None).
    if group["momentum"] == 0:
        return {}
    return {"momentum_buffer": LIKE_PARAM}  # a clone of the gradient


def _rmsprop_layout(opt, group, p):
    layout = {}
    if _TORCH_2:  # 1.13's step is an int, not a tensor
        layout["step"] = ((), _scalar_step_dtype(), p.device if group["capturable"] else _CPU)
    layout["square_avg"] = LIKE_PARAM
    if group["momentum"] > 0:
        layout["momentum_buffer"] = LIKE_PARAM
    if group["centered"]:
        layout["grad_avg"] = LIKE_PARAM
    return layout


# Exact classes: a subclass may create other state. (Adagrad creates its state
# in its constructor, so it never needs materialising.)
_FIRST_STEP_LAYOUTS = {
    torch.optim.Adam: _adam_layout,
    torch.optim.AdamW: _adam_layout,
    torch.optim.SGD: _sgd_layout,
    torch.optim.RMSprop: _rmsprop_layout,
}


def first_step_state_layouts(opt):
    """{param: layout} for every param of `opt`, or None when its class or
    options have no known layout."""
    layout_of = _FIRST_STEP_LAYOUTS.get(type(opt))
    if layout_of is None or not _LAYOUTS_KNOWN:
        return None
    layouts = {}
    for group in opt.param_groups:
        for p in group["params"]:
            layout = layout_of(opt, group, p)
            if layout is None:
                return None
            layouts[p] = layout
    return layouts


@torch.no_grad()
def probe_state_layouts(opt, params):
    """{param: {key: (shape, dtype, device)}} of the state an optimizer of
    unknown layout creates, found by one zero-gradient, zero-lr step whose
    effects on parameters, gradients, learning rates, state, step counter
    and RNG are all undone. Costs a copy of every parameter and of any
    existing state, and a full optimizer step."""
    saved_values = [p.detach().clone() for p in params]
    saved_grads = [p.grad for p in params]
    saved_lrs = [g["lr"] for g in opt.param_groups]
    saved_state = {}
    for p in params:
        if opt.state.get(p):
            objs = dict(opt.state[p])
            clones = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in objs.items()}
            saved_state[p] = (objs, clones)
    saved_count = getattr(opt, "_step_count", None)
    saved_rng = torch.get_rng_state()
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        for g in opt.param_groups:
            g["lr"] = 0.0
        try:
            # The class's step: no instance wrappers (schedulers), and in
            # PyTorch 2.x not the hook wrapper either (step hooks would
            # see a step that is not one).
            step = type(opt).step
            if getattr(step, "hooked", False) and hasattr(step, "__wrapped__"):
                step = step.__wrapped__
            step(opt)
        except Exception as e:
            raise RuntimeError(
                "zcc could not materialise the state of %s with a zero-gradient, zero-lr "
                "probe step (%s); create the Checkpointer after the first optimizer.step()"
                % (type(opt).__name__, e)) from e
        layouts = {p: {k: layout_of(p, v) for k, v in opt.state.get(p, {}).items()
                       if torch.is_tensor(v)} for p in params}
    finally:
        for p, v, grad in zip(params, saved_values, saved_grads):
            p.copy_(v)
            p.grad = grad
        for g, lr in zip(opt.param_groups, saved_lrs):
            g["lr"] = lr
        for p in params:
            if p in saved_state:
                objs, clones = saved_state[p]
                for k, v in objs.items():
                    if torch.is_tensor(v):
                        v.copy_(clones[k])
                opt.state[p] = objs
            else:
                opt.state.pop(p, None)
        if saved_count is not None:
            opt._step_count = saved_count
        torch.set_rng_state(saved_rng)
    return layouts
