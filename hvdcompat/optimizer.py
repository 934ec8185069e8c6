"""DistributedOptimizer: averages gradients across ranks while backward is still running.

Note [Gradient hooks]: each trainable parameter gets a post-accumulate-grad
hook. After ``backward_passes_per_step`` backward passes have accumulated into
``p.grad`` the hook starts an in-place asynchronous allreduce of it, so
communication of late layers overlaps the backward pass of early ones.
``synchronize()`` (run by ``step()``) starts whatever the hooks did not
(parameters unused on this rank contribute zeros, so every rank submits the
same names and none waits forever) and waits for everything.

Note [Operation names]: ranks match operations by name. Each parameter's
allreduce is named after it (``_parameter_names``, Horovod's names). Two
optimizers whose models share parameter names (a GAN's generator and
discriminator built from the same blocks) would submit equal names at the
same time; so the second and later optimizers communicating on a process set
prefix their names with ``optimizer<k>.``, where k counts the optimizers
created before it on a set with the same member ranks. The first optimizer
keeps Horovod's exact names. Every member rank must therefore create its
communicating optimizers in the same order, which scripts that build the
same models on every rank do.
"""

import contextlib
import functools
import warnings
import weakref

import torch

from hvdcompat.adasum_optimizer import adasum_class
from hvdcompat.basics import Adasum, Average, _core, size
from hvdcompat.functions import broadcast_object
from hvdcompat.ops.collectives import allreduce_async_
from hvdcompat.ops.compression import Compression
from hvdcompat.ops.grouped import grouped_allreduce_async_
from hvdcompat.ops.handles import synchronize as _wait
from hvdcompat.ops.sparse import sparse_allreduce_async
from hvdcompat.process_sets import global_process_set

__all__ = ["DistributedOptimizer"]

# member ranks of a process set -> optimizers created so far that communicate on it
# (Note [Operation names]). Kept for the process: an optimizer outlives
# shutdown, init and elastic resets with the names it was given.
_optimizers_per_set = {}

_MAX_LISTED = 20


def _shape(t):
    return list(t.shape)


class _Work:
    """One in-flight reduction: its handle and how to write the result back."""

    __slots__ = ("handle", "params", "sent", "ctxs", "kind")

    def __init__(self, handle, params, sent, ctxs, kind):
        self.handle = handle
        self.params = params    # the parameters whose gradients it reduces
        self.sent = sent        # the tensors handed to the engine, one per parameter
        self.ctxs = ctxs        # compression contexts
        self.kind = kind        # "dense", "sparse", "sparse_as_dense" or "group"


class _DistributedOptimizer:
    """The methods of every distributed optimizer class (see :func:`_distributed_class`).

    Never instantiated itself: its namespace is copied into a subclass of the
    user's optimizer class, so ``super(self.__class__, self)`` is that class.
    """

    _hvdcompat_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set, defaults,
                 state):
        try:
            super(self.__class__, self).__init__(params)
        except TypeError:
            # Optimizers with required constructor arguments: the groups already hold every
            # option, the defaults only have to satisfy the signature.
            super(self.__class__, self).__init__(params, **defaults)
        # Groups added later get the user's defaults, not the class's.
        self.defaults = dict(defaults)
        # Keep state loaded before wrapping (Horovod drops it).
        self.state = state
        self._compression = compression
        self._parameter_names = self._name_parameters(named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step
                                 for g in self.param_groups for p in g["params"]}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._groups = self._check_groups(groups)
        self._p_to_group = {}
        self._group_counts = {}
        self._name_prefix = ""
        self._communicates = bool(process_set.included()) and (
            process_set.size() > 1 or _core.setting("ELASTIC"))
        if self._communicates:
            # Keyed by the member ranks, not the set id: ids are reused after
            # remove_process_set, and a reused id may have other members.
            key = tuple(process_set.ranks)
            index = _optimizers_per_set.get(key, 0)
            _optimizers_per_set[key] = index + 1
            self._name_prefix = f"optimizer{index}." if index else ""
            self._register_hooks()

    # ----- construction -------------------------------------------------------------------

    def _auto_names(self):
        """Horovod's positional names, or the names of an optimizer built from named params."""
        positional = {p: f"allreduce.noname.{i}.{j}" for i, g in enumerate(self.param_groups)
                      for j, p in enumerate(g["params"])}
        given = {}
        for group in self.param_groups:
            names = group.get("param_names")
            if names is None or len(names) != len(group["params"]):
                return positional
            given.update(zip(group["params"], names))
        return given if len(set(given.values())) == len(given) else positional

    def _name_parameters(self, named_parameters):
        if named_parameters is None:
            return self._auto_names()
        if isinstance(named_parameters, torch.nn.Module):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                             "usually produced by model.named_parameters(); got the module "
                             "itself. Pass model.named_parameters() (or "
                             "hvd.merge_named_parameters(model1, model2, ...)).")
        named_parameters = list(named_parameters)
        if any(not isinstance(item, tuple) for item in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                             "usually produced by model.named_parameters().")
        dups = self.find_duplicates([name for name, _ in named_parameters])
        if dups:
            raise ValueError(
                "Parameter names in named_parameters must be unique. Found duplicates: "
                + ", ".join(sorted(dups)) + ". This happens when several models' "
                "named_parameters() are concatenated; use "
                "hvd.merge_named_parameters(model1, model2, ...), which prefixes each model's "
                "names.")
        named_ids = {id(p) for _, p in named_parameters}
        self._check_all_named(named_ids)
        return {p: name for name, p in sorted(named_parameters, key=lambda item: item[0])}

    def _check_all_named(self, named_ids):
        missing = []
        for i, group in enumerate(self.param_groups):
            given = group.get("param_names")
            for j, p in enumerate(group["params"]):
                if id(p) not in named_ids:
                    where = f"param_groups[{i}]['params'][{j}]"
                    if given is not None and j < len(given):
                        where += f" (named '{given[j]}' in the optimizer)"
                    missing.append(f"{where}: shape {_shape(p)}, dtype {p.dtype}, "
                                   f"python id {id(p)}")
        if not missing:
            return
        listed = "\n  ".join(missing[:_MAX_LISTED])
        more = (f"\n  ... and {len(missing) - _MAX_LISTED} more" if len(missing) > _MAX_LISTED
                else "")
        raise ValueError(
            "named_parameters was specified, but one or more model parameters were not named. "
            "DistributedOptimizer needs a name for every parameter the optimizer updates; "
            f"{len(missing)} parameter(s) have no name:\n  {listed}{more}\n"
            "If the optimizer covers several models (GAN, encoder + decoder, teacher + student), "
            "name all of them: named_parameters=hvd.merge_named_parameters(model1, model2, ...).")

    @staticmethod
    def find_duplicates(lst):
        """The set of items that occur more than once in `lst`."""
        seen, dups = set(), set()
        for item in lst:
            if item in seen:
                dups.add(item)
            seen.add(item)
        return dups

    def _check_groups(self, groups):
        if groups is None:
            return None
        if isinstance(groups, bool) or not (isinstance(groups, list)
                                            or (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a non-negative integer or a list of list of "
                             "torch.Tensor.")
        if isinstance(groups, list):
            seen = set()
            for group in groups:
                for p in group:
                    if not isinstance(p, torch.Tensor):
                        raise ValueError("groups must consist of torch.Tensor.")
                    if id(p) in seen:
                        raise ValueError("A parameter can only appear once in groups.")
                    seen.add(id(p))
        return groups

    def _trainable_in_rank0_order(self):
        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        names = [self._parameter_names[p] for p in params]
        root = self.process_set.ranks[0]
        order = broadcast_object(names, root_rank=root, name="DistributedOptimizer.groups",
                                 process_set=self.process_set)
        by_name = dict(zip(names, params))
        if sorted(order) != sorted(names):
            raise ValueError(
                f"DistributedOptimizer(groups=...): rank {root} trains parameters "
                f"{sorted(set(order) - set(names))[:_MAX_LISTED]} that this rank does not, and "
                f"this rank trains {sorted(set(names) - set(order))[:_MAX_LISTED]} that rank "
                f"{root} does not; build the same model and optimizer on every rank.")
        return [by_name[n] for n in order]

    def _make_groups(self):
        params = self._trainable_in_rank0_order()
        if isinstance(self._groups, int):
            n = min(self._groups, len(params))
            q, r = divmod(len(params), n) if n else (0, 0)
            chunks, start = [], 0
            for k in range(n):
                end = start + q + (1 if k < r else 0)
                chunks.append(tuple(params[start:end]))
                start = end
        else:
            trainable = {id(p) for p in params}
            chunks = [tuple(p for p in g if id(p) in trainable) for g in self._groups]
            chunks = [c for c in chunks if c]
            grouped = {id(p) for c in chunks for p in c}
            chunks += [(p,) for p in params if id(p) not in grouped]
        for chunk in chunks:
            self._group_counts[chunk] = 0
            for p in chunk:
                self._p_to_group[p] = chunk

    def _register_hooks(self):
        if self._groups is not None:
            self._make_groups()
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
                    self._grad_accs.append(p.register_post_accumulate_grad_hook(make_hook(p)))

    # ----- the hook path --------------------------------------------------------------------

    def _grad_ready(self, p):
        if self._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call to "
                "step(). Increase backward_passes_per_step to accumulate gradients locally. "
                f"(Parameter '{self._parameter_names.get(p)}' received a gradient "
                f"{self.backward_passes_per_step + 1} times; call optimizer.step() or "
                "optimizer.synchronize() after every backward_passes_per_step backward passes, "
                "or construct DistributedOptimizer(..., backward_passes_per_step=N).)")
        if p.grad is not None and p.grad.requires_grad:
            raise AssertionError(
                f"DistributedOptimizer: the gradient of '{self._parameter_names.get(p)}' "
                "requires grad (backward(create_graph=True)); it cannot be reduced in place. "
                "Use torch.autograd.grad for higher-order terms.")
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] > 0:
            return
        group = self._p_to_group.get(p)
        if group is None:
            self._handles[p] = self._launch(p)
            return
        self._group_counts[group] += 1
        if self._group_counts[group] == len(group):
            self._handles[group] = self._launch_group(group)

    def _engine_name(self, p):
        return self._name_prefix + self._parameter_names[p]

    def _scale_factors(self):
        if self.op == Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _dense_grad(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        elif not p.grad.is_sparse and not p.grad.is_contiguous():
            p.grad = p.grad.contiguous()
        return p.grad

    def _launch(self, p):
        grad = self._dense_grad(p)
        name = self._engine_name(p)
        kind = "dense"
        if grad.is_sparse:
            if not self.sparse_as_dense:
                handle = sparse_allreduce_async(grad.coalesce(), name=name, op=self.op,
                                                process_set=self.process_set)
                return _Work(handle, (p,), (None,), (None,), "sparse")
            grad, kind = grad.to_dense(), "sparse_as_dense"
        sent, ctx = self._compression.compress(grad)
        pre, post = self._scale_factors()
        handle = allreduce_async_(sent, name=name, op=self.op, prescale_factor=pre,
                                  postscale_factor=post, process_set=self.process_set)
        return _Work(handle, (p,), (sent,), (ctx,), kind)

    def _launch_group(self, group):
        sent, ctxs = [], []
        for p in group:
            grad = self._dense_grad(p)
            if grad.is_sparse:
                grad = grad.to_dense()
            t, ctx = self._compression.compress(grad)
            sent.append(t)
            ctxs.append(ctx)
        pre, post = self._scale_factors()
        handle = grouped_allreduce_async_(sent, name=self._engine_name(group[0]), op=self.op,
                                          prescale_factor=pre, postscale_factor=post,
                                          process_set=self.process_set)
        return _Work(handle, group, tuple(sent), tuple(ctxs), "group")

    # ----- synchronization ------------------------------------------------------------------

    def _has_pending_work(self):
        return bool(self._handles) or any(self._allreduce_delay[p] != self.backward_passes_per_step
                                          for p in self._requires_update)

    def _finish(self, work):
        if work.kind == "sparse":
            (p,) = work.params
            p.grad = work.handle().coalesce()
            return
        _wait(work.handle)
        for p, sent, ctx in zip(work.params, work.sent, work.ctxs):
            out = self._compression.decompress(sent, ctx)
            if p.grad.is_sparse:
                p.grad = out.to_sparse(sparse_dim=p.grad.sparse_dim())
            elif out is not p.grad:
                p.grad.copy_(out)

    def synchronize(self):
        """Finishes the allreduce of every gradient; ``step()`` calls it unless skipped.

        Parameters whose gradient was not computed on this rank (unused in
        its forward pass) contribute zeros. Call it before reading or
        clipping gradients, then step inside :meth:`skip_synchronize`.
        """
        if not self._communicates:
            self._synchronized = True
            return
        done = set()
        for key in self._handles:
            done.update(key if isinstance(key, tuple) else (key,))
        for p in sorted(self._requires_update - done, key=self._parameter_names.get):
            group = self._p_to_group.get(p)
            if group is None:
                self._handles[p] = self._launch(p)
            elif group not in self._handles:
                self._handles[group] = self._launch_group(group)
        try:
            for work in self._handles.values():
                self._finish(work)
        finally:
            self._handles.clear()
            for p in self._allreduce_delay:
                self._allreduce_delay[p] = self.backward_passes_per_step
            for group in self._group_counts:
                self._group_counts[group] = 0
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Context in which ``step()`` does not synchronize (call :meth:`synchronize` first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Synchronizes the gradients (unless inside :meth:`skip_synchronize`), then steps."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to "
                    "consider using optimizer.skip_synchronize() context if you use "
                    "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        """Zeroes the gradients; gradient reductions still in flight are finished first.

        (Horovod raises an AssertionError instead; finishing them keeps every
        rank's operations matched.)
        """
        if self._communicates and self._has_pending_work():
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        """Loads optimizer state; forgets gradient reductions started before (no communication)."""
        self._handles.clear()
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        for group in self._group_counts:
            self._group_counts[group] = 0
        return super(self.__class__, self).load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        """Changes how many backward passes accumulate locally before each allreduce."""
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes


@functools.cache
def _distributed_class(base):
    """A subclass of `base`, named like it, holding _DistributedOptimizer's methods.

    As in Horovod, the class's only base is the user's class, so
    ``super(type(opt), opt).step()`` is the user's own, unsynchronized step.
    One per class (cached) keeps isinstance stable.
    """
    namespace = {k: v for k, v in vars(_DistributedOptimizer).items()
                 if k not in ("__dict__", "__weakref__")}
    return type(base.__name__, (base,), namespace)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps `optimizer` so that ``step()`` applies gradients averaged over all ranks.

    Returns an instance of a subclass of `optimizer`'s class (``isinstance``,
    ``state_dict()`` and ``load_state_dict()`` work as before) that shares
    its parameter groups and state. Gradient allreduces start while backward
    is still running; ``step()`` waits for them. Every rank must build the
    same model and optimizer, and (when several optimizers communicate)
    create them in the same order.

    Args:
        optimizer: the torch optimizer to wrap.
        named_parameters: ``(name, parameter)`` pairs naming every parameter
            of `optimizer`, e.g. ``model.named_parameters()``; with several
            models use :func:`hvdcompat.merge_named_parameters`. Default:
            names derived from positions in the parameter groups.
        compression: ``hvd.Compression.none``, ``.fp16`` or ``.bf16``
            (gradients travel in that precision).
        backward_passes_per_step: backward passes accumulated locally
            before each allreduce (gradients are summed over the passes).
        op: ``hvd.Average`` (default) or ``hvd.Sum`` (also Min, Max, Product).
            ``hvd.Adasum`` makes it a delta optimizer (Note [Delta optimizer]
            in ``hvdcompat/adasum_optimizer.py``): each rank steps locally and
            the updates are combined by Adasum; only `named_parameters`,
            `compression` and `backward_passes_per_step` apply then.
        gradient_predivide_factor: with Average, gradients are multiplied by
            ``1/f`` before the sum and by ``f/size`` after (guards fp16 range).
        num_groups: deprecated; use ``groups``.
        groups: an int (split the parameters into that many fused groups) or
            a list of lists of parameters reduced together.
        sparse_as_dense: reduce sparse gradients as dense tensors instead of
            allgathering their entries.
        process_set: the ranks to average over. On non-members, or when the
            set has a single rank, the optimizer is purely local.

    Returns:
        The distributed optimizer.

    Raises:
        ValueError: bad argument, duplicate or missing parameter names (the
            message lists the unnamed parameters).
        NotImplementedError: ``op=hvd.Adasum`` with a process set other
            than the global one (a ValueError and a NotImplementedError).
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if getattr(optimizer, "_hvdcompat_distributed", False):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap the plain torch "
                         "optimizer only once.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if op == Adasum and size() > 1:
        return _adasum_optimizer(optimizer, named_parameters, compression,
                                 backward_passes_per_step, process_set)
    cls = _distributed_class(type(optimizer))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set,
               optimizer.defaults, optimizer.state)


def _adasum_optimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                      process_set):
    # The core's rule, before any gradient exists (a NotImplementedError and a ValueError).
    pid = process_set.process_set_id
    _core.check_reduction("DistributedOptimizer(op=hvd.Adasum)", "",
                          -1 if pid is None else pid, _core.ReduceOp(Adasum))
    key = tuple(global_process_set.ranks)
    index = _optimizers_per_set.get(key, 0)
    _optimizers_per_set[key] = index + 1
    cls = adasum_class(type(optimizer), _DistributedOptimizer)
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               optimizer.defaults, optimizer.state, f"optimizer{index}." if index else "")
