"""Restoring a zcc.torch.Checkpointer: the registered tensors filled from
zccd's memory or a committed step, then the optimizer's state and
hyperparameters, the scheduler, the random generators and user_state put
back. With a process group every rank restores the same step (agreed over the
group); with replicas each restores the pieces it writes and receives the rest
from the ranks that read them, so the job reads the checkpoint once."""

import collections

import torch

import zcc
from zcc import _plain_state
from zcc import _rng_state


class Restoring:
    """The restore half of Checkpointer (a mixin: it works on the
    Checkpointer's registration)."""

    @torch.no_grad()
    def restore(self, step=None):
        """Restores the newest committed checkpoint (or `step`) into the model,
        optimizer, scheduler, RNG states and user_state, and zccd's EMA.
        Returns the step, or None when the job has no checkpoint yet. Raises
        zcc.UnavailableError when zccd cannot be reached within connect_timeout."""
        unavailable = None
        if not self.wait_connected():
            unavailable = zcc.UnavailableError(
                "not registered with zccd after %.1f s: %s"
                % (self.connect_timeout, self.client.stats()["last_error"]))
        else:
            self.fence()
        got = self._restore_tensors(step, unavailable)
        if got is None:
            return None
        for b, shadow in self._buffers:
            b.copy_(shadow)
        trainer = self._blobs["trainer_state"].read() or {}
        opt = self.optimizer
        if opt is not None:
            bound = set(trainer.get("bound", []))
            nontensor = trainer.get("nontensor_state", {})
            for i, p in enumerate(self._opt_params):
                if i in bound:
                    state = dict(nontensor.get(i, {}))
                    state.update(self._opt_bufs[i])
                    opt.state[p] = state
                else:
                    opt.state.pop(p, None)
                self._bound[i] = i in bound
            groups = trainer.get("param_groups")
            if groups is not None:
                if len(groups) != len(opt.param_groups):
                    raise zcc.FailedPreconditionError(
                        "the checkpoint has %d optimizer param groups; the optimizer has %d"
                        % (len(groups), len(opt.param_groups)))
                for g, saved in zip(opt.param_groups, groups):
                    for k, v in saved.items():
                        g[k] = _plain_state.restore_hyperparameter(g.get(k), v)
            if trainer.get("optimizer_step_count") is not None:
                opt._step_count = trainer["optimizer_step_count"]
        sched = self._blobs["scheduler"].read()
        if self.scheduler is not None and sched is not None:
            self.scheduler.load_state_dict(
                _plain_state.restore_hyperparameter(self.scheduler.state_dict(), sched))
        torch.set_rng_state(self._rng.clone())
        if "python_random" in trainer:
            _rng_state.set_python_rng_state(trainer["python_random"])
        _rng_state.set_numpy_rng_state(trainer.get("numpy_random"))
        if trainer.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(s), dtype=torch.uint8)
                                          for s in trainer["cuda_rng"]])
        user = self._blobs["user_state"].read()
        if user is not None:
            self.user_state.clear()
            self.user_state.update(user)
        self._last_step = got
        return got

    def _process_group(self):
        dist = torch.distributed
        if self.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return None
        return dist

    def _restore_once(self, step, owned_only, allow_older):
        """(result, None), (None, None) when there is nothing to restore, or
        (None, error): with a process group an error must not leave this rank
        out of the collectives the others are in."""
        try:
            return self.client.restore_tensors(step, self._stream(), owned_only=owned_only,
                                               allow_older=allow_older), None
        except zcc.NotFoundError:
            return None, None
        except Exception as e:  # re-raised once every rank knows
            return None, e

    def _collective_device(self, dist):
        # NCCL reduces only device tensors; gloo takes host tensors.
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _restore_tensors(self, step, unavailable=None):
        """Fills the registered tensors; returns the step (None: nothing to
        restore). With a process group, every rank restores the same step:
        without `step`, the newest one every rank can restore (from zccd's
        memory or from disk), agreed over the group; a rank that finds it
        damaged falls back to an older one and the others follow. An error on
        any rank is raised on every rank (none is left waiting); `unavailable`
        is this rank's, found before it could ask zccd anything."""
        dist = self._process_group()
        if dist is None and unavailable is not None:
            raise unavailable
        if dist is None:
            result, error = self._restore_once(zcc.LATEST if step is None else step, False, False)
            if error is not None:
                raise error
            self.restored_from = None if result is None else result["source"]
            return None if result is None else result["step"]
        share = self._share_replicas
        target = step
        if step is None:
            try:
                if unavailable is not None:
                    raise unavailable
                offered = self.client.restore_candidates(owned_only=share)
                mine, error = sorted(set(offered["memory"]) | set(offered["disk"])), None
            except Exception as e:  # re-raised once every rank knows
                mine, error = None, e
            everyone = [None] * self.world_size
            dist.all_gather_object(everyone, mine)
            if error is not None:
                raise error
            failed = [r for r, steps in enumerate(everyone) if steps is None]
            if failed:
                raise zcc.UnavailableError("ranks %s could not list their restorable steps; see "
                                           "their logs" % failed)
            common = set(everyone[0]).intersection(*everyone[1:])
            if not common:
                if any(everyone):
                    raise zcc.FailedPreconditionError(
                        "no step can be restored by every rank (steps per rank: %s)"
                        % {r: s[-5:] for r, s in enumerate(everyone)})
                return None
            target = max(common)
        device = self._collective_device(dist)
        if unavailable is not None:
            result, error = None, unavailable
        else:
            result, error = self._restore_once(target, share, step is None)
        while True:
            # -2: this rank failed; -1: it found nothing to restore.
            got = -2 if error is not None else -1 if result is None else result["step"]
            low = torch.tensor([got], dtype=torch.int64, device=device)
            high = low.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            if error is not None:
                raise error
            if low.item() == -2:
                raise zcc.UnavailableError("another rank failed to restore step %s; see its log"
                                           % target)
            if low.item() == high.item():
                break
            if low.item() < 0:
                raise zcc.FailedPreconditionError("some ranks restored step %d and others nothing"
                                                  % high.item())
            if got != low.item():
                result, error = self._restore_once(int(low.item()), share, step is None)
        if result is None:
            return None
        if share:
            self._receive_replicas(result["restored"])
        self.restored_from = result["source"]
        return result["step"]

    @staticmethod
    def _bytes_of(t):
        return t.reshape(-1).view(torch.uint8) if t.numel() > 0 else t.new_empty(0, dtype=torch.uint8)

    def _receive_replicas(self, restored):
        """After an owned_only restore: every piece a rank did not restore
        comes from the lowest rank that did (a piece: a tensor's name and
        where it starts), one broadcast per source rank."""
        dist = torch.distributed
        specs = [s for s in self._specs if s.kind != zcc.TensorKind.EXTRA]  # per rank: own
        got = [r for s, r in zip(self._specs, restored) if s.kind != zcc.TensorKind.EXTRA]
        key = lambda spec: (spec.name, tuple(spec.offset))  # noqa: E731
        mine = sorted((key(s), s.tensor.numel() * s.tensor.element_size())
                      for s, r in zip(specs, got) if r)
        need = sorted(key(s) for s, r in zip(specs, got) if not r)
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, (mine, need))
        owner = {}
        for rank, (have, _) in enumerate(everyone):
            for k, nbytes in have:
                owner.setdefault(k, (rank, nbytes))
        sends = collections.defaultdict(dict)  # source rank -> {piece: bytes}
        for rank, (_, needs) in enumerate(everyone):
            for k in needs:
                if k not in owner:
                    # Every rank sees the same lists: all raise, none waits.
                    raise zcc.DataLossError("no rank restored '%s' (at offset %s); the checkpoint "
                                            "cannot fill it on rank %d" % (k[0], list(k[1]), rank))
                src, nbytes = owner[k]
                sends[src][k] = nbytes
        tensors = {key(s): s.tensor for s in specs}
        wanted = set(need)
        device = self._collective_device(dist)
        for src in sorted(sends):
            pieces = sorted(sends[src].items())
            flat = torch.empty(sum(n for _, n in pieces), dtype=torch.uint8, device=device)
            offset = 0
            if self.rank == src:
                for k, n in pieces:
                    flat[offset:offset + n].copy_(self._bytes_of(tensors[k]))
                    offset += n
            dist.broadcast(flat, src=src)
            if self.rank != src:
                for k, n in pieces:
                    if k in wanted:
                        self._bytes_of(tensors[k]).copy_(flat[offset:offset + n])
                    offset += n
