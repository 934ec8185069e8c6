"""DistributedOptimizer(op=hvd.Adasum): each rank steps locally, the steps are combined by Adasum.

Note [Delta optimizer]: Adasum combines *updates*, not gradients, so the
wrapped optimizer's own rule (momentum, Adam's moments, weight decay) runs
on every rank with its local gradient first. When a parameter's gradient is
ready (after ``backward_passes_per_step`` passes) its hook steps the wrapped
optimizer for that parameter alone, turns the parameter into the update
(``new - start``), and starts an in-place Adasum allreduce of it (through the
compression). ``step()`` waits, adds the combined update to the starting
value and writes it back. Until ``step()`` returns, a parameter whose hook
ran holds its update, not its value: do not read the model between backward
and ``step()``. As in Horovod, ``synchronize()`` does nothing and
``skip_synchronize()`` is refused (gradient clipping must happen before
backward's hooks step, e.g. through the wrapped optimizer itself).
"""

import contextlib
import functools
import weakref

import torch

from hvdcompat.basics import Adasum
from hvdcompat.ops.collectives import allreduce_async_
from hvdcompat.ops.handles import synchronize as _wait

__all__ = []


class _DistributedAdasumOptimizer:
    """Methods of the Adasum distributed optimizer class (see :func:`adasum_class`).

    Never instantiated itself: its namespace is copied into a subclass of
    the user's optimizer class, so ``super(self.__class__, self)`` is that
    class. Naming helpers are shared with the averaging optimizer.
    """

    _hvdcompat_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 defaults, state, name_prefix):
        try:
            super(self.__class__, self).__init__(params)
        except TypeError:
            super(self.__class__, self).__init__(params, **defaults)
        self.defaults = dict(defaults)
        self.state = state
        self.op = Adasum
        self._compression = compression
        self._parameter_names = self._name_parameters(named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step
                                 for g in self.param_groups for p in g["params"]}
        self._name_prefix = name_prefix
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._starting_models = {}
        self._register_hooks()

    def _register_hooks(self):
        this = weakref.ref(self)

        def make_hook(p):
            def hook(param):
                opt = this()
                if opt is not None:
                    opt._grad_ready(p)
            return hook

        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    self._starting_models[p] = torch.zeros_like(p, requires_grad=False)
                    self._grad_accs.append(p.register_post_accumulate_grad_hook(make_hook(p)))

    def _grad_ready(self, p):
        if p in self._handles and self._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call to "
                "step(). Increase backward_passes_per_step to accumulate gradients locally. "
                f"(Parameter '{self._parameter_names.get(p)}' received a gradient "
                f"{self.backward_passes_per_step + 1} times; call optimizer.step() after every "
                "backward_passes_per_step backward passes.)")
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] == 0:
            self._handles[p] = self._launch(p)
        else:
            self._handles[p] = None

    def _launch(self, p):
        """Steps `p` alone, leaves its update in it, starts the Adasum of the update."""
        start = self._starting_models[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is q for q in group["params"]) else []
        try:
            start.copy_(p.data)
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        p.data.sub_(start)
        sent, ctx = self._compression.compress(p.data)
        handle = allreduce_async_(sent, name=self._name_prefix + self._parameter_names[p],
                                  op=Adasum)
        return handle, sent, ctx

    def synchronize(self):
        """Does nothing: the updates are combined in ``step()`` (as in Horovod)."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Refused with AssertionError, as in Horovod: the Adasum optimizer has no separate sync."""
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer (DistributedOptimizer(op=hvd.Adasum) steps each "
                             "parameter locally in backward and combines the updates in step()).")
        yield  # pragma: no cover

    def step(self, closure=None):
        """Combines every rank's update by Adasum and applies it to the starting values.

        Parameters whose gradient never arrived on this rank (unused in its
        forward pass), or that had fewer than ``backward_passes_per_step``
        passes, are stepped now, so every rank submits the same names.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for p in sorted(self._requires_update, key=self._parameter_names.get):
            if self._handles.get(p) is None:
                self._handles[p] = self._launch(p)
        try:
            for p, (handle, sent, ctx) in self._handles.items():
                _wait(handle)
                delta = self._compression.decompress(sent, ctx)
                start = self._starting_models[p]
                start.add_(delta.to(start.dtype))
                p.data.copy_(start)
        finally:
            self._handles.clear()
            for p in self._allreduce_delay:
                self._allreduce_delay[p] = self.backward_passes_per_step
        return loss

    def zero_grad(self, *args, **kwargs):
        """Zeroes the gradients; refused between backward and ``step()`` (as in Horovod)."""
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it can cause "
                "a race condition. (With op=hvd.Adasum the parameters hold their local updates "
                "until step(); call step() first.)")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        """Changes how many backward passes accumulate locally before each local step."""
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes


@functools.cache
def adasum_class(base, shared):
    """A subclass of `base`, named like it, holding the Adasum optimizer's methods.

    `shared`: the averaging optimizer's class, whose parameter naming helpers
    are reused. One class per `base` (cached) keeps isinstance stable.
    """
    namespace = {k: vars(shared)[k] for k in ("_auto_names", "_name_parameters",
                                              "_check_all_named", "find_duplicates")}
    namespace.update({k: v for k, v in vars(_DistributedAdasumOptimizer).items()
                      if k not in ("__dict__", "__weakref__")})
    return type(base.__name__, (base,), namespace)
