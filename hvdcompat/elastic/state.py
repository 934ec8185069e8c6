"""TorchState and the handlers that save, restore and sync models, optimizers and samplers."""

import copy

import torch

from hvdcompat.basics import rank
from hvdcompat.elastic.common import ObjectState
from hvdcompat.elastic.sampler import ElasticSampler
from hvdcompat.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = ["TorchState", "StateHandler", "ModelStateHandler", "OptimizerStateHandler",
           "SamplerStateHandler", "get_handler_registry", "set_handler_registry"]


class TorchState(ObjectState):
    """The state of a PyTorch training process.

    Each keyword argument becomes an attribute. A value whose type has a
    handler in the registry (:func:`get_handler_registry`: ``nn.Module``,
    ``Optimizer``, :class:`ElasticSampler` by default) is saved, restored and
    synced by it; anything else is a plain Python object (copied by
    reference on save, broadcast from rank 0 on sync). Assigning a new value
    to a handled attribute (``state.model = other_model``) saves it at once.

    Args:
        model: a model, or None.
        optimizer: an optimizer, or None.
        **kwargs: more attributes (further models, optimizers, samplers,
            counters such as ``epoch=0, batch=0``).
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(dict(model=model, optimizer=optimizer))
        self._handlers, kwargs = _get_handlers(kwargs)
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def saved_values(self):
        values = super().saved_values()
        values["handlers"] = {name: h.saved_value() for name, h in self._handlers.items()}
        return values

    def load_saved_values(self, values):
        missing = sorted(set(self._handlers) - set(values.get("handlers", {})))
        if missing:
            raise ValueError(f"elastic restart: the saved state has no value for {missing}; "
                             "the training script must build the same TorchState on every "
                             "launch")
        for name, handler in self._handlers.items():
            handler.load_saved_value(values["handlers"][name])
        super().load_saved_values(values)
        for handler in self._handlers.values():
            handler.restore()

    def on_reset(self):
        # The world may have changed size: handlers whose value depends on it
        # (the sampler's partition) adapt before the callbacks run, also when
        # the sync after the reset is skipped.
        for handler in self._handlers.values():
            handler.on_reset()
        super().on_reset()

    def __setattr__(self, name, value):
        if hasattr(self, name) and name in self._handlers:
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)


class StateHandler:
    """Saves, restores and syncs one kind of value for :class:`TorchState`.

    Subclass it and add ``(type, subclass)`` to :func:`get_handler_registry`
    (or pass a new list to :func:`set_handler_registry`) to handle more types.

    Args:
        value: the object handled.
    """

    def __init__(self, value):
        self.value = value

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def on_reset(self):
        """Called after every reset; nothing by default."""

    def saved_value(self):
        """The last saved value, picklable (written when the job restarts on new hosts).

        The built-in handlers keep it in ``self._saved``; a handler of its
        own must keep it there too, or override this and :meth:`load_saved_value`.
        """
        if not hasattr(self, "_saved"):
            raise NotImplementedError(
                f"{type(self).__name__} keeps no '_saved' value, so its state cannot be carried "
                "over a restart of the job (hosts were added): define saved_value() and "
                "load_saved_value()")
        return self._saved

    def load_saved_value(self, value):
        """Makes `value` (from :meth:`saved_value`) the saved value; restore() applies it."""
        self._saved = value

    def set_value(self, value):
        """Handles a new object from now on, and saves it."""
        self.value = value
        self.save()


class ModelStateHandler(StateHandler):
    """A ``torch.nn.Module``: a deep copy of its state_dict; sync broadcasts rank 0's parameters."""

    def __init__(self, model):
        super().__init__(model)
        self._saved = copy.deepcopy(self.value.state_dict())

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateHandler):
    """A ``torch.optim.Optimizer``: a deep copy of its state_dict; sync broadcasts rank 0's."""

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self._saved = copy.deepcopy(self.value.state_dict())

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(StateHandler):
    """An :class:`ElasticSampler`: its epoch and processed count; re-partitions after a reset."""

    def __init__(self, sampler):
        super().__init__(sampler)
        self._saved = copy.deepcopy(self.value.state_dict())

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))

    def on_reset(self):
        self.value.reset()


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    """The ``[(type, handler class), ...]`` list; the first type that matches a value wins."""
    return _handler_registry


def set_handler_registry(registry):
    """Replaces the handler list (see :func:`get_handler_registry`)."""
    global _handler_registry
    _handler_registry = registry


def _get_handler(value):
    for handler_type, handler_cls in _handler_registry:
        if isinstance(value, handler_type):
            return handler_cls(value)
    return None


def _get_handlers(kwargs):
    handlers, remainder = {}, {}
    for k, v in kwargs.items():
        handler = _get_handler(v)
        if handler is not None:
            handlers[k] = handler
        else:
            remainder[k] = v
    return handlers, remainder
