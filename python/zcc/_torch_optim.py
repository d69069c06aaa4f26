"""The optimizer side of a zcc.torch.Checkpointer: its state registered
before the optimizer has any (zcc._optim_state), bound to the registered
buffers once the optimizer creates it, and optimizer.step wrapped with the
fence that keeps it from overwriting tensors zcc is still copying."""

import collections
import operator
import weakref

import torch

from zcc import _optim_state
from zcc import torch_layout

# The attribute an LR scheduler sets on the optimizer.step it wraps and looks
# for at its first step: PyTorch 1.x's counting wrapper, then 2.x's.
_LR_SCHEDULER_STEP_MARKERS = ("_with_counter", "_wrapped_by_lr_sched")

# torch.optim classes (exact: a subclass may do otherwise) whose step updates
# every state tensor in place and never puts another in its place: once their
# state is bound, step() checks only that the container and the number of
# parameters with state are unchanged, not every entry (a check that costs a
# model with thousands of parameters tens of microseconds a step).
# The optimizer's state as the last binding left it (_remember_binding):
#   container, size:  optimizer.state and how many parameters had state
#   dicts, lengths:   each bound parameter's state dict and its entry count
#   pairs:            (dicts, keys, buffers), flat: each registered entry
#   nontensor:        (index, dict, keys) of the non-tensor entries
#   bound:            one byte per optimizer parameter, 1 where bound
#   in_place:         the optimizer is one of _UPDATES_IN_PLACE
_Binding = collections.namedtuple(
    "_Binding", "container size dicts lengths pairs nontensor bound in_place")

_UPDATES_IN_PLACE = frozenset({torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD,
                               torch.optim.RMSprop, torch.optim.Adagrad})


class OptimizerBinding:
    """The optimizer half of Checkpointer (a mixin: it works on the
    Checkpointer's registration)."""

    def _materialise_optimizer_state(self):
        """Allocates and describes a buffer for every optimizer state tensor:
        the optimizer's own tensor where it already has state, else a fresh
        (unwritten) tensor shaped like the state its first step will create."""
        opt = self.optimizer
        params = [p for g in opt.param_groups for p in g["params"]]
        self._opt_params = params
        layouts = {}
        if any(not opt.state.get(p) for p in params):
            layouts = _optim_state.first_step_state_layouts(opt)
            if layouts is None:
                layouts = _optim_state.probe_state_layouts(opt, params)
        pieces = []
        for i, p in enumerate(params):
            bufs = {}
            existing = opt.state.get(p)
            if existing:
                items = [(k, v) for k, v in existing.items() if torch.is_tensor(v)]
            else:
                # Not zeroed here: a restore or the optimizer's first step
                # (binding) overwrites them; step() zeroes any left unbound.
                items = [(k, _optim_state.empty_state(p, layout)) for k, layout in layouts[p].items()]
                self._unzeroed[i] = [_optim_state.local(v) for _, v in items]
            for key, value in items:
                if not isinstance(key, str):
                    raise TypeError("optimizer state key %r is not a string" % (key,))
                # An existing tensor that is not contiguous cannot be registered
                # as is: register a copy, which binding puts in its place.
                buf = value if _optim_state.local(value).is_contiguous() else torch.zeros_like(
                    value, memory_format=torch.contiguous_format)
                bufs[key] = buf
                name = "optimizer.state.%s.%s" % (self._param_name(p, i), key)
                pieces.append((name, torch_layout.piece_of(name, buf, self.rank, self._plain_members),
                               "optim", False))
            self._opt_bufs.append(bufs)
            self._bound.append(False)
        # State that existed before the Checkpointer: bind it now (copy if the
        # optimizer's tensor could not be registered as is).
        self._bind_optimizer_state()
        return pieces

    def _wrap_optimizer_step(self):
        """Fences before every optimizer.step. A torch.optim.Optimizer gets a
        step pre-hook: it runs inside the optimizer's own step, whatever
        stands in for the `step` attribute (Accelerate's and the Hugging Face
        Trainer's loss-scaling paths put back, after each step, the method
        they saved before the Checkpointer was made, which would drop a
        wrapper and with it the fence: a step would then update tensors zcc
        is still copying). Other optimizers get CheckpointerBase's wrapper,
        carrying the LR schedulers' markers."""
        register = getattr(self.optimizer, "register_step_pre_hook", None)
        if register is None:
            super()._wrap_optimizer_step(markers=_LR_SCHEDULER_STEP_MARKERS)
            return
        ref = weakref.ref(self)

        def fence_first(_optimizer, _args, _kwargs):
            ckpt = ref()
            if ckpt is not None and not ckpt.client.closed:
                ckpt.fence()

        self._step_hook = register(fence_first)

    @torch.no_grad()
    def _bind_optimizer_state(self):
        if self.optimizer is None:
            return
        if self._state_as_bound():
            return
        state = self.optimizer.state
        for i, p in enumerate(self._opt_params):
            current = state.get(p)
            if not current:
                if self._bound[i]:
                    raise RuntimeError("the optimizer dropped its state for parameter '%s'; "
                                       "zcc cannot follow" % self._param_name(p, i))
                continue
            bufs = self._opt_bufs[i]
            for key, value in current.items():
                if torch.is_tensor(value) and key not in bufs:
                    raise RuntimeError("optimizer state '%s' of parameter '%s' appeared after "
                                       "registration; zcc cannot checkpoint it"
                                       % (key, self._param_name(p, i)))
            for key, buf in bufs.items():
                value = current.get(key)
                if value is buf:
                    continue
                if not torch.is_tensor(value) or value.shape != buf.shape or value.dtype != buf.dtype:
                    raise RuntimeError("optimizer state '%s' of parameter '%s' does not match the "
                                       "registered %s %s" % (key, self._param_name(p, i),
                                                            buf.dtype, tuple(buf.shape)))
                buf.copy_(value)
                current[key] = buf
            self._bound[i] = True
        self._remember_binding()

    def _remember_binding(self):
        """Notes the optimizer's state as bound now, for _state_as_bound()
        and the trainer state's non-tensor entries."""
        state = self.optimizer.state
        dicts, nontensor = [], []
        pair_dicts, keys, bufs = [], [], []  # flat, for one C-level check
        for i, p in enumerate(self._opt_params):
            if not self._bound[i]:
                continue
            current = state[p]
            dicts.append(current)
            for key, buf in self._opt_bufs[i].items():
                pair_dicts.append(current)
                keys.append(key)
                bufs.append(buf)
            plain = [k for k, v in current.items() if not torch.is_tensor(v)]
            if plain:
                nontensor.append((i, current, plain))
        self._binding = _Binding(state, len(state), dicts, [len(d) for d in dicts],
                                 (pair_dicts, keys, bufs), nontensor,
                                 bytes(1 if b else 0 for b in self._bound),
                                 type(self.optimizer) in _UPDATES_IN_PLACE)

    def _state_as_bound(self):
        """True when the optimizer's state is as the last binding left it: the
        same container with as many parameters, each bound parameter's dict
        with as many entries and our buffers under their keys. Then nothing
        needs binding, and its non-tensor entries are under the same keys.
        For the optimizers of _UPDATES_IN_PLACE, the container and its size.
        (A dict of a parameter replaced by another one is missed: nothing in
        PyTorch's optimizers does that; load_state_dict replaces the whole
        container, and Checkpointer.restore forgets the binding.)"""
        b = self._binding
        if b is None:
            return False
        state = self.optimizer.state
        if state is not b.container or len(state) != b.size:
            return False
        if b.in_place:
            return True
        if list(map(len, b.dicts)) != b.lengths:
            return False
        # Every registered key still holds our buffer: map and all loop in C
        # (a Python loop over thousands of entries costs the trainer).
        pair_dicts, keys, bufs = b.pairs
        return all(map(operator.is_, map(dict.get, pair_dicts, keys), bufs))

    def _nontensor_state(self):
        """The bound parameters' non-tensor optimizer state, {index: {key: value}}."""
        return {i: {k: current[k] for k in keys} for i, current, keys in self._binding.nontensor}
