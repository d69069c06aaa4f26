"""Restoring a zcc.torch.Checkpointer: the registered tensors filled from
zccd's memory or a committed step, then the optimizer's state and
hyperparameters, the scheduler, the random generators and user_state put
back. With a process group every rank restores the same step (agreed over the
group); with replicas each restores the pieces it writes and receives the rest
from the ranks that read them, so the job reads the checkpoint once."""

import warnings

import torch

import zcc
from zcc import _plain_state


class Restoring:
    """The restore half of Checkpointer (a mixin: it works on the
    Checkpointer's registration)."""

    @torch.no_grad()
    def restore(self, step=None):
        """Restores the newest committed checkpoint (or `step`) into the model,
        optimizer, scheduler, RNG states and user_state, and zccd's EMA.
        Returns the step, or None when the job has no checkpoint yet (without
        `step`; a `step` that cannot be restored raises zcc.NotFoundError, or
        the error its read found). Raises zcc.UnavailableError when zccd
        cannot be reached within connect_timeout."""
        # The restore writes the RNG tensor (the step's state, or zeros where
        # the step has none for this rank) whether or not the generator is
        # set from it: the next step() reads the generator again.
        self._torch_generator.forget()
        unavailable = None
        if not self.wait_connected():
            unavailable = zcc.UnavailableError(
                "not registered with zccd after %.1f s: %s"
                % (self.connect_timeout, self.client.stats()["last_error"]))
        else:
            self.fence()
        got = self._restore_growing(lambda: self._restore_tensors(step, unavailable))
        if got is None:
            return None
        for b, shadow in self._buffers:
            b.copy_(shadow)
        job = self._blobs["job"].read() or {}
        trainer = job.get("trainer") or {}
        opt = self.optimizer
        if opt is not None:
            bound = {i for i, b in enumerate(trainer.get("bound", b"")) if b}
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
                        g[k] = _plain_state.restore_hyperparameter(g.get(k), v, self._codec)
            self._remember_binding()  # the state dicts are new ones
            if trainer.get("optimizer_step_count") is not None:
                opt._step_count = trainer["optimizer_step_count"]
        sched = job.get("scheduler")
        if self.scheduler is not None and sched is not None:
            self.scheduler.load_state_dict(
                _plain_state.restore_hyperparameter(self.scheduler.state_dict(), sched, self._codec))
        self._restore_rank_state(trainer.get("world_size", self.world_size))
        self._last_step = got
        return got

    def _restore_rank_state(self, saved_world):
        """This rank's RNG states and user_state, when the checkpoint has
        them. A job that grew finds none for its new ranks: they keep their
        random generators as seeded and take rank 0's user_state (a counter
        such as the epoch must agree across ranks). A job that shrank leaves
        the state of the ranks it lost behind; rank 0 says so."""
        names = self._rank_state_names
        missing = self._missing_state
        own = not any(name in missing for name in names.values())
        self.restored_rank_state = own
        if names["torch_rng"] not in missing:
            torch.set_rng_state(self._rng.clone())
        blob = self._blobs["rank"]
        mine = blob.read() if names["rank_state"] not in missing else None
        user_from_rank0 = None
        if self.world_size > saved_world and self._job_wide:
            # Every rank knows saved_world (job-wide state): all take part.
            dist = self._process_group()
            if dist is not None:
                # Rank 0's user_state as an object: each rank's blob is sized
                # for its own state, so the blobs need not be equal in size.
                box = [dict((mine or {}).get("user_state") or {}) if self.rank == 0 else None]
                dist.broadcast_object_list(box, src=0)
                if mine is None:
                    user_from_rank0 = box[0]
        rng = self._apply_rank_state(mine, user_from_rank0)
        if rng.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(s), dtype=torch.uint8)
                                          for s in rng["cuda_rng"]])
        if not own:
            warnings.warn(
                "zcc: step %d was written by %d rank(s); rank %d had no state of its own in it: "
                "its random generators and `state` objects stay as they were%s"
                % (self._restoring_step, saved_world, self.rank,
                   ", its user_state is rank 0's" if user_from_rank0 is not None else ""))
        elif self.rank == 0 and saved_world > self.world_size:
            warnings.warn(
                "zcc: step %d was written by %d ranks; the RNG states, user_state and `state` "
                "objects of ranks "
                "%d-%d are not restored on %d rank(s)"
                % (self._restoring_step, saved_world, self.world_size, saved_world - 1,
                   self.world_size))

    def _process_group(self):
        dist = torch.distributed
        if self.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return None
        return dist

    def _collective_device(self, dist):
        # NCCL reduces only device tensors; gloo takes host tensors.
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _restore_tensors(self, step, unavailable=None):
        """Fills the registered tensors; returns the step (None: nothing to
        restore; an explicit `step` that cannot be restored raises
        zcc.NotFoundError instead). With a process group every rank restores the same step,
        through the protocol C++ trainers use (Client::RestoreTogether, over
        torch.distributed here): without `step`, the newest one every rank can
        restore (from zccd's memory or from disk); a rank that finds it
        damaged falls back to an older one and the others follow; each rank
        reads from its zccd only the pieces it writes and receives the others
        from the lowest rank that read them. An error on any rank is raised
        on every rank (none is left waiting); `unavailable` is this rank's,
        found before it could ask zccd anything."""
        dist = self._process_group()
        target = zcc.LATEST if step is None else step
        if dist is None:
            if unavailable is not None:
                raise unavailable
            try:
                result = self.client.restore_tensors(target, self._stream(),
                                                     allow_older=step is None,
                                                     early_copy=self._early_copy)
            except zcc.NotFoundError:
                if step is not None:
                    raise  # the step asked for: not "nothing to restore"
                return None
            return self._restored(result)
        try:
            result = self.client.restore_together(target, self._stream(), self.rank,
                                                  self.world_size, self._all_gather,
                                                  self._broadcast_many,
                                                  early_copy=self._early_copy)
        except zcc.NotFoundError:
            if unavailable is not None:
                raise unavailable
            if step is not None:
                raise
            return None
        except Exception:
            if unavailable is not None:
                raise unavailable
            raise
        return self._restored(result)

    def _share_job_peers(self):
        """Where each rank's zccd serves its peers, all-gathered over the
        process group and told to this rank's zccd, which learns the job's
        nodes from it; returns the zccds holding this node's replicas ([]
        without a process group or a peer service). Collective only where
        this rank's zccd has a peer service: the zccds of one job are
        configured alike (peer.listen on all of them, or on none)."""
        mine = self.client.peer_address
        dist = self._process_group()
        if dist is None or not mine:
            return []
        everyone = [b.decode() for b in self._all_gather(mine.encode())]
        return self.client.set_job_peers(everyone)

    def _all_gather(self, mine):
        """Every rank's `mine` (bytes), by rank: RestoreTogether's all-gather."""
        everyone = [None] * self.world_size
        torch.distributed.all_gather_object(everyone, bytes(mine))
        return everyone

    @staticmethod
    def _bytes_of(t):
        return t.reshape(-1).view(torch.uint8) if t.numel() > 0 else t.new_empty(0, dtype=torch.uint8)

    def _broadcast_many(self, pieces, root):
        """RestoreTogether's broadcasts from `root`: `pieces` are (address,
        nbytes) of registered tensors (address 0 where this rank keeps no
        copy), sent packed in one broadcast."""
        dist = torch.distributed
        if self._by_address is None:
            self._by_address = {s.tensor.data_ptr(): s.tensor for s in self._specs
                                if s.tensor.numel() > 0}
        flat = torch.empty(sum(n for _, n in pieces), dtype=torch.uint8,
                           device=self._collective_device(dist))
        offset = 0
        if self.rank == root:
            for address, n in pieces:
                flat[offset:offset + n].copy_(self._bytes_of(self._by_address[address]))
                offset += n
        dist.broadcast(flat, src=root)
        if self.rank != root:
            for address, n in pieces:
                if address:
                    self._bytes_of(self._by_address[address]).copy_(flat[offset:offset + n])
                offset += n
