"""Horovod's module names on hvdcompat, for scripts that ``import horovod.torch as hvd``.

Opt-in, in one of two ways (docs/migration.md shows both):

- per command: ``python -m hvdcompat.horovod_alias train.py ARGS...`` (also
  under ``hvdcompatrun``/``mpirun``); nothing is installed;
- per environment: ``pip install -e ./alias`` installs the
  ``hvdcompat-horovod-alias`` distribution, a ``horovod`` package whose
  ``__init__`` calls :func:`fill_package`, and a ``horovodrun`` command
  (:func:`horovodrun_main`, hvdcompatrun under horovodrun's name).

Note [Horovod alias]: the names served are ``horovod`` (``run``,
``__version__``), ``horovod.torch`` and its submodules (``mpi_ops``,
``compression``, ``functions``, ``optimizer``, ``sync_batch_norm``,
``elastic``), ``horovod.common.exceptions``/``process_sets`` and
``horovod.runner``. ``horovod.torch`` is a module of its own that holds
hvdcompat's public names (and forwards any other lookup to ``hvdcompat``), so
``hvd.allreduce is hvdcompat.allreduce``. They are served by a finder placed
*last* on ``sys.meta_path``: a real Horovod anywhere on ``sys.path`` is found
first by Python's own path finder, so the alias can never hide it. On top of
that, both ways refuse outright when a real Horovod is installed (its
distribution metadata, or a ``horovod`` package that is not this alias), so
no one ends up running the one they did not mean to.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types

__all__ = ["HOROVOD_API_VERSION", "ALIAS_DISTRIBUTION", "HorovodInstalledError",
           "real_horovod", "install", "is_active", "fill_package", "horovodrun_main"]

# The Horovod release whose API hvdcompat implements: what `horovod.__version__` says.
HOROVOD_API_VERSION = "0.28.1"
ALIAS_DISTRIBUTION = "hvdcompat-horovod-alias"
# Set on the alias's `horovod` module; hvdcompat.run passes the alias on to its ranks.
_MARKER = "__hvdcompat_alias__"
# Text that the installed alias's horovod/__init__.py contains (how it is told apart).
_ALIAS_SOURCE_TAG = "hvdcompat.horovod_alias"

# Alias name -> the hvdcompat module it is (plain submodules, served as they are).
_SAME_MODULE = {
    "horovod.torch.mpi_ops": "hvdcompat.mpi_ops",
    "horovod.torch.compression": "hvdcompat.compression",
    "horovod.torch.functions": "hvdcompat.functions",
    "horovod.torch.optimizer": "hvdcompat.optimizer",
    "horovod.torch.sync_batch_norm": "hvdcompat.sync_batch_norm",
    "horovod.common.exceptions": "hvdcompat.exceptions",
    "horovod.common.process_sets": "hvdcompat.process_sets",
}
_PACKAGES = ("horovod", "horovod.torch", "horovod.common", "horovod.runner")


class HorovodInstalledError(ImportError):
    """A real Horovod is installed, so the alias steps aside."""


def _is_alias_package(spec):
    try:
        with open(spec.origin, encoding="utf-8", errors="replace") as f:
            return _ALIAS_SOURCE_TAG in f.read(4096)
    except (OSError, TypeError):
        return False


def real_horovod():
    """Describes the real Horovod installed here, or returns None.

    Looks for the ``horovod`` distribution's metadata (pip's record of an
    install) and for any ``horovod`` package on ``sys.path`` that is not this
    alias.
    """
    try:
        dist = importlib.metadata.distribution("horovod")
        return f"Horovod {dist.version} (installed at {dist.locate_file('')})"
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.machinery.PathFinder.find_spec("horovod")
    if spec is not None and not _is_alias_package(spec):
        where = spec.origin or ", ".join(spec.submodule_search_locations or [])
        return f"a 'horovod' package at {where}"
    return None


def _refusal(real, how):
    return (f"{how}: {real} is installed in this environment, so hvdcompat's Horovod alias "
            "stays off and never stands in for it. To run this script on hvdcompat, either "
            "change its import to `import hvdcompat as hvd` (and launch with hvdcompatrun), "
            "or use an environment without Horovod (pip uninstall horovod). If "
            f"{ALIAS_DISTRIBUTION} was installed here too, `pip uninstall {ALIAS_DISTRIBUTION}` "
            "and reinstall Horovod (pip install --force-reinstall --no-deps horovod) to "
            "restore its files.")


def _top_level(namespace):
    import hvdcompat

    namespace.update({
        _MARKER: True,
        "__version__": HOROVOD_API_VERSION,
        "hvdcompat_version": hvdcompat.__version__,
        "run": hvdcompat.run,
        "__all__": ["run", "__version__"],
    })


def _torch_module():
    import hvdcompat

    mod = types.ModuleType("horovod.torch", "hvdcompat under Horovod's name (horovod.torch).")
    public = {k: v for k, v in vars(hvdcompat).items() if not k.startswith("__")}
    mod.__dict__.update(public)
    mod.__all__ = list(hvdcompat.__all__)

    def __getattr__(name):
        if name == "elastic":
            return importlib.import_module("horovod.torch.elastic")
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return getattr(hvdcompat, name)
        except AttributeError:
            raise AttributeError(f"module 'horovod.torch' (hvdcompat's Horovod alias) has no "
                                 f"attribute {name!r}; hvdcompat does not provide it") from None

    mod.__getattr__ = __getattr__
    return mod


def _elastic_module():
    if importlib.util.find_spec("hvdcompat.elastic") is not None:
        return importlib.import_module("hvdcompat.elastic")
    mod = types.ModuleType("horovod.torch.elastic", "Elastic training (not available yet).")

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotImplementedError(
            f"horovod.torch.elastic.{name}: elastic training is not available in this version "
            "of hvdcompat. Train with a fixed set of ranks (hvd.init() and a plain training "
            "loop, launched with hvdcompatrun -np N or mpirun).")

    mod.__getattr__ = __getattr__
    return mod


def _runner_module():
    import hvdcompat

    mod = types.ModuleType("horovod.runner", "horovod.run, on hvdcompat.")
    mod.run = hvdcompat.run
    mod.__all__ = ["run"]
    return mod


def _launch_module():
    mod = types.ModuleType("horovod.runner.launch", "horovodrun's entry point, on hvdcompat.")

    def run_commandline():
        sys.exit(horovodrun_main())

    mod.run_commandline = run_commandline
    return mod


def _build(name):
    if name == "horovod":
        mod = types.ModuleType("horovod", "Horovod's top-level names on hvdcompat.")
        _top_level(mod.__dict__)
        return mod
    builders = {"horovod.torch": _torch_module, "horovod.torch.elastic": _elastic_module,
                "horovod.runner": _runner_module, "horovod.runner.launch": _launch_module,
                "horovod.common": lambda: types.ModuleType("horovod.common")}
    mod = builders[name]()
    # The plain submodules are hvdcompat's own module objects, registered as
    # the package is built: Python finds them in sys.modules and never asks a
    # finder, so their own __spec__ stays intact.
    for alias, target in _SAME_MODULE.items():
        parent, _, child = alias.rpartition(".")
        if parent == name:
            module = importlib.import_module(target)
            sys.modules.setdefault(alias, module)
            setattr(mod, child, module)
    return mod


def _served():
    return {"horovod", "horovod.torch", "horovod.torch.elastic", "horovod.runner",
            "horovod.runner.launch", "horovod.common"}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the alias names of Note [Horovod alias]; sits last on ``sys.meta_path``."""

    def find_spec(self, name, path=None, target=None):
        if name != "horovod" and not name.startswith("horovod."):
            return None
        if name not in _served():
            offered = ", ".join(sorted(_served() | set(_SAME_MODULE)))
            raise ModuleNotFoundError(
                f"No module named {name!r}: hvdcompat's Horovod alias provides {offered} "
                "(hvdcompat is Horovod for PyTorch only)", name=name)
        return importlib.util.spec_from_loader(name, self, is_package=name in _PACKAGES)

    def create_module(self, spec):
        return _build(spec.name)

    def exec_module(self, module):
        pass  # built complete by create_module


def is_active():
    """Whether this process imports ``horovod`` through the alias."""
    return any(isinstance(f, _AliasFinder) for f in sys.meta_path)


def install():
    """Makes ``import horovod`` (and the names of Note [Horovod alias]) resolve to hvdcompat.

    Idempotent; affects this process only.

    Raises:
        HorovodInstalledError: a real Horovod is installed here.
    """
    real = real_horovod()
    if real is not None:
        raise HorovodInstalledError(_refusal(real, "hvdcompat.horovod_alias"))
    if not is_active():
        sys.meta_path.append(_AliasFinder())


def fill_package(namespace):
    """Turns the installed alias's ``horovod/__init__`` namespace into Horovod's top level.

    Raises:
        HorovodInstalledError: a real Horovod is installed here too.
    """
    install()
    _top_level(namespace)


def horovodrun_main(argv=None):
    """``horovodrun``: hvdcompatrun under Horovod's name; returns the exit code."""
    real = real_horovod()
    if real is not None:
        print(_refusal(real, "horovodrun (from " + ALIAS_DISTRIBUTION + ")"), file=sys.stderr)
        return 2
    from hvdcompat.runner.launch import main

    return main(argv)
