"""Training helpers: start every rank from the same state, share Python objects, merge models.

Every function here is a collective: every rank of the process set must call
it, in the same order, with the same ``root_rank``.
"""

import collections.abc

import cloudpickle
import torch

from hvdcompat.basics import rank
from hvdcompat.ops.collectives import _set_rank_size, allgather_async, broadcast_async_
from hvdcompat.ops.handles import synchronize
from hvdcompat.process_sets import global_process_set

__all__ = [
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "merge_named_parameters", "merge_state_dicts",
]


def _check_member(process_set, what):
    """ValueError from the core unless this rank is a member of `process_set`."""
    _set_rank_size(process_set, what)


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites `params` on every rank with global rank `root_rank`'s values, in place.

    Typically ``hvd.broadcast_parameters(model.state_dict(), root_rank=0)``
    right after building the model (and after rank 0 loaded a checkpoint).

    Args:
        params: a dict of name -> tensor (e.g. ``model.state_dict()``; sent
            in key order), or a list of tensors or of ``(name, tensor)``
            pairs (e.g. ``list(model.named_parameters())``). With several
            models, merge them first: :func:`merge_state_dicts`.
        root_rank: the global rank whose values everyone receives.
        process_set: the ranks to broadcast among (root must be a member).

    Returns:
        None: the tensors of `params` hold the root's values.

    Raises:
        ValueError: `params` is not a dict or list, holds a non-tensor, or
            this rank is not in `process_set`.
    """
    if isinstance(params, collections.abc.Mapping):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, (list, tuple)):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}. broadcast_parameters takes a "
                         "dict such as model.state_dict(), or a list of tensors or (name, tensor) "
                         "pairs: wrap generators in list(...).")
    _check_member(process_set, "broadcast_parameters")
    pending = []
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"broadcast_parameters: entry {name!r} is a {type(p).__name__}, not a "
                             "tensor; send non-tensor values with hvd.broadcast_object.")
        # The core writes whole contiguous buffers; strided views go through a copy.
        target = p if p.is_contiguous() else p.detach().contiguous()
        handle = broadcast_async_(target, root_rank, name=None if name is None else str(name),
                                  process_set=process_set)
        pending.append((handle, p, target))
    for handle, p, target in pending:
        synchronize(handle)
        if target is not p:
            with torch.no_grad():
                p.copy_(target)


def _sparse_embedding_params(model):
    if model is None:
        return set()
    return {m.weight for m in model.modules()
            if isinstance(m, torch.nn.Embedding) and m.sparse}


def _give_missing_grads(optimizer, model):
    """Zero gradients for trainable parameters without one (Horovod does so on fresh optimizers)."""
    sparse_params = _sparse_embedding_params(model)
    all_sparse = isinstance(optimizer, torch.optim.SparseAdam)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                grad = torch.zeros_like(p)
                if all_sparse or p in sparse_params:
                    grad = grad.to_sparse()
                p.grad = grad


def _portable(value):
    """Option values travel pickled; tensors go via the CPU so any rank can unpickle them."""
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def _describe_optimizer(optimizer):
    """Root's optimizer layout: options per group, and per parameter its state entries."""
    groups = []
    for group in optimizer.param_groups:
        options = {k: _portable(v) for k, v in group.items() if k != "params"}
        states = {}
        for j, p in enumerate(group["params"]):
            st = optimizer.state.get(p)
            if not st:
                continue
            entry = {}
            for key, value in st.items():
                if isinstance(value, torch.Tensor):
                    entry[key] = ("tensor", tuple(value.shape), value.dtype,
                                  value.device == p.device)
                else:
                    entry[key] = ("value", value)
            states[j] = entry
        groups.append({"options": options, "states": states, "count": len(group["params"])})
    return groups


def _apply_options(optimizer, groups):
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(f"broadcast_optimizer_state: the root optimizer has {len(groups)} "
                         f"parameter groups but rank {rank()} has {len(optimizer.param_groups)}; "
                         "build the optimizer identically on every rank.")
    for i, (desc, group) in enumerate(zip(groups, optimizer.param_groups)):
        if desc["count"] != len(group["params"]):
            raise ValueError(f"broadcast_optimizer_state: parameter group {i} holds "
                             f"{desc['count']} parameters on the root but {len(group['params'])} "
                             f"on rank {rank()}; build the optimizer identically on every rank.")
        for key, value in desc["options"].items():
            old = group.get(key)
            if isinstance(value, torch.Tensor) and isinstance(old, torch.Tensor):
                value = value.to(old.device)
            group[key] = value


def _state_tensors(optimizer, groups, is_root):
    """Makes local state match the root's layout; returns the (name, tensor) pairs to send.

    On other ranks, entries the root does not have are dropped, missing or
    differently shaped tensors are allocated, and plain values are taken
    from the root.
    """
    tensors = []
    for i, (desc, group) in enumerate(zip(groups, optimizer.param_groups)):
        for j, p in enumerate(group["params"]):
            wanted = desc["states"].get(j)
            if is_root:
                tensors.extend((f"optimizer_state.{i}.{j}.{key}", optimizer.state[p][key])
                               for key, spec in (wanted or {}).items() if spec[0] == "tensor")
                continue
            if not wanted:
                optimizer.state.pop(p, None)
                continue
            st = optimizer.state[p]
            for key in [k for k in st if k not in wanted]:
                del st[key]
            for key, spec in wanted.items():
                if spec[0] == "value":
                    st[key] = spec[1]
                    continue
                _, shape, dtype, on_param_device = spec
                device = p.device if on_param_device else torch.device("cpu")
                cur = st.get(key)
                if not (isinstance(cur, torch.Tensor) and tuple(cur.shape) == shape
                        and cur.dtype == dtype and cur.device == device):
                    cur = torch.zeros(shape, dtype=dtype, device=device)
                    st[key] = cur
                tensors.append((f"optimizer_state.{i}.{j}.{key}", cur))
    return tensors


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Gives every rank global rank `root_rank`'s optimizer hyper-parameters and state.

    Hyper-parameters (``lr``, ``momentum``, ``betas``, ...) travel pickled,
    so their Python types survive (a tuple stays a tuple, a bool a bool);
    state tensors (momentum buffers, Adam moments, step counters) are
    broadcast in place, allocated first where a rank lacks them. Afterwards
    every rank's state has exactly the root's entries. On a rank whose
    optimizer has no state yet, trainable parameters without a gradient get
    a zero gradient (sparse for ``SparseAdam`` and for sparse embeddings of
    `model`), as Horovod does.

    Args:
        optimizer: a torch optimizer, wrapped in DistributedOptimizer or not.
        root_rank: the global rank whose state everyone receives.
        model: optional; used to find sparse ``nn.Embedding`` parameters.
        process_set: the ranks to broadcast among (root must be a member).

    Returns:
        None: `optimizer` holds the root's hyper-parameters and state.

    Raises:
        ValueError: ``torch.optim.LBFGS`` (its state is not per parameter),
            or the optimizers differ in layout between ranks.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    _check_member(process_set, "broadcast_optimizer_state")
    has_state = any(optimizer.state.get(p) for g in optimizer.param_groups for p in g["params"])
    if not has_state:
        _give_missing_grads(optimizer, model)
    is_root = rank() == root_rank
    layout = _describe_optimizer(optimizer) if is_root else None
    layout = broadcast_object(layout, root_rank, name="optimizer_layout", process_set=process_set)
    if not is_root:
        _apply_options(optimizer, layout)
    broadcast_parameters(_state_tensors(optimizer, layout, is_root), root_rank,
                         process_set=process_set)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns global rank `root_rank`'s `obj` on every rank (pickled with cloudpickle).

    Args:
        obj: any picklable object; ignored on the other ranks (pass None).
        root_rank: the global rank that sends.
        name: op name; every rank must use the same one (the default is
            fixed, so ranks may pass objects of different types).
        process_set: the ranks to broadcast among (root must be a member).

    Returns:
        The root's object (on the root, `obj` itself).

    Raises:
        ValueError: hvdcompat is not initialised, or this rank is not in
            `process_set`.
        HorovodInternalError: the ranks disagreed or the job failed.
    """
    _check_member(process_set, "broadcast_object")
    name = "broadcast_object" if name is None else name
    is_root = rank() == root_rank
    if is_root:
        payload = torch.frombuffer(bytearray(cloudpickle.dumps(obj)), dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    synchronize(broadcast_async_(length, root_rank, name=f"{name}.sz", process_set=process_set))
    if not is_root:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    synchronize(broadcast_async_(payload, root_rank, name=f"{name}.t", process_set=process_set))
    return obj if is_root else cloudpickle.loads(payload.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's `obj`, in rank order (pickled with cloudpickle).

    Args:
        obj: any picklable object; ranks may pass different types.
        name: op name; every rank must use the same one.
        process_set: the ranks to gather from (ours; Horovod gathers from all).

    Returns:
        A list with one object per rank of `process_set`.

    Raises:
        ValueError: hvdcompat is not initialised, or this rank is not in
            `process_set`.
        HorovodInternalError: the ranks disagreed or the job failed.
    """
    _check_member(process_set, "allgather_object")
    name = "allgather_object" if name is None else name
    payload = torch.frombuffer(bytearray(cloudpickle.dumps(obj)), dtype=torch.uint8)
    sizes = synchronize(allgather_async(torch.tensor([payload.numel()], dtype=torch.int64),
                                        name=f"{name}.sz", process_set=process_set))
    data = synchronize(allgather_async(payload, name=f"{name}.t", process_set=process_set))
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(cloudpickle.loads(data[offset:offset + n].numpy().tobytes()))
        offset += n
    return out


def _prefixes(count, prefixes, what):
    if prefixes is None:
        return [f"model{i}." for i in range(count)]
    if isinstance(prefixes, str) or len(prefixes) != count:
        raise ValueError(f"{what}: prefixes must be a list with one string per model ({count}), "
                         f"got {prefixes!r}")
    out = []
    for p in prefixes:
        if not isinstance(p, str):
            raise ValueError(f"{what}: prefixes must be strings, got {p!r}")
        out.append(p if p == "" or p.endswith(".") else p + ".")
    return out


def _expand_single_list(sources):
    if len(sources) == 1 and isinstance(sources[0], (list, tuple)) and sources[0] and all(
            isinstance(m, torch.nn.Module) for m in sources[0]):
        return list(sources[0])
    return list(sources)


def _report_duplicates(seen, what, hint):
    dups = {name: origins for name, origins in seen.items() if len(origins) > 1}
    if dups:
        listed = "; ".join(f"'{n}' (from models {', '.join(map(str, o))})"
                           for n, o in sorted(dups.items()))
        raise ValueError(f"{what}: duplicate names after prefixing: {listed}. {hint}")


def merge_named_parameters(*models_or_named_params, prefixes=None):
    """Combines several models' named parameters for one DistributedOptimizer.

    ``hvd.DistributedOptimizer(opt, named_parameters=hvd.merge_named_parameters(gen, disc))``
    names every parameter ``model0.<name>``, ``model1.<name>``, ... (or with
    the given prefixes), so parameters of different models never share a
    name. A parameter object that appears in several models (shared weights)
    is listed once, under its first name.

    Args:
        *models_or_named_params: ``nn.Module`` objects, or iterables of
            ``(name, parameter)`` pairs such as ``model.named_parameters()``.
        prefixes: one string per model (a ``.`` is appended when missing;
            ``""`` keeps the names as they are). Default ``model0.``, ...

    Returns:
        A list of ``(name, parameter)`` pairs.

    Raises:
        ValueError: malformed input, wrong number of prefixes, or two
            different parameters with the same final name.
    """
    sources = _expand_single_list(models_or_named_params)
    what = "merge_named_parameters"
    prefixes = _prefixes(len(sources), prefixes, what)
    merged, seen_ids, seen_names = [], set(), {}
    for i, (source, prefix) in enumerate(zip(sources, prefixes)):
        if isinstance(source, torch.nn.Module):
            pairs = source.named_parameters()
        elif isinstance(source, collections.abc.Mapping):
            pairs = source.items()
        else:
            pairs = source
        for item in pairs:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], torch.Tensor)):
                raise ValueError(f"{what}: model {i} yielded {item!r}; pass modules or iterables "
                                 "of (name, parameter) pairs such as model.named_parameters()")
            name, param = item
            if id(param) in seen_ids:
                continue
            seen_ids.add(id(param))
            full = prefix + name
            seen_names.setdefault(full, []).append(i)
            merged.append((full, param))
    _report_duplicates(seen_names, what, "Give each model a distinct prefix with prefixes=[...].")
    return merged


def merge_state_dicts(*state_dicts, prefixes=None):
    """Combines several state dicts (or modules) into one dict for :func:`broadcast_parameters`.

    Keys are prefixed exactly as :func:`merge_named_parameters` does
    (``model0.``, ``model1.``, ... or the given prefixes), so
    ``hvd.broadcast_parameters(hvd.merge_state_dicts(gen, disc), root_rank=0)``
    sends every tensor of both models even when their keys coincide. A
    tensor whose memory already appears under an earlier key (tied weights)
    is listed once.

    Args:
        *state_dicts: mappings of name -> tensor, or ``nn.Module`` objects
            (their ``state_dict()`` is used).
        prefixes: one string per state dict; default ``model0.``, ...

    Returns:
        A dict of prefixed name -> tensor (the tensors are the originals, so
        in-place broadcasts update the models).

    Raises:
        ValueError: wrong number of prefixes, or duplicate keys after prefixing.
    """
    sources = _expand_single_list(state_dicts)
    what = "merge_state_dicts"
    prefixes = _prefixes(len(sources), prefixes, what)
    merged, seen_memory, seen_names = {}, set(), {}
    for i, (source, prefix) in enumerate(zip(sources, prefixes)):
        if isinstance(source, torch.nn.Module):
            source = source.state_dict()
        if not isinstance(source, collections.abc.Mapping):
            raise ValueError(f"{what}: argument {i} is a {type(source).__name__}; pass state "
                             "dicts or modules")
        for key, value in source.items():
            if isinstance(value, torch.Tensor) and value.numel() > 0:
                memory = (value.device, value.data_ptr(), value.dtype, tuple(value.shape),
                          value.stride())
                if memory in seen_memory:
                    continue
                seen_memory.add(memory)
            full = prefix + str(key)
            seen_names.setdefault(full, []).append(i)
            merged[full] = value
    _report_duplicates(seen_names, what, "Give each state dict a distinct prefix with "
                                         "prefixes=[...].")
    return merged
