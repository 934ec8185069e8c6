"""Horovod 0.28.1 as the peer of a benchmark (a helper of the benchmarks).

A benchmark that puts Horovod itself beside hvdcompat runs one job per
implementation, alternating, each launched by its own environment's mpirun
(each was built against its own MPI; two MPIs cannot share a process).
Horovod's environment: the ``--horovod-python`` a script takes, else
$HOROVOD_PYTHON, else /tmp/horovod-anchor/venv/bin/python. Without one that
imports horovod.torch, the benchmark leaves Horovod's column out and says so.
"""

import os
import subprocess

DEFAULT_HOROVOD = "/tmp/horovod-anchor/venv/bin/python"


def find(path=None):
    """``(python, about)``: Horovod's interpreter and its version, or ``(None, why not)``."""
    path = path or os.environ.get("HOROVOD_PYTHON") or DEFAULT_HOROVOD
    if not os.access(path, os.X_OK):
        return None, f"no Horovod environment ({path} does not exist)"
    probe = subprocess.run([path, "-c", "import horovod, horovod.torch; print(horovod.__version__)"],
                           capture_output=True, text=True, cwd="/", timeout=300)
    if probe.returncode != 0:
        return None, f"{path} cannot import horovod.torch: {probe.stderr.strip()[-300:]}"
    return path, probe.stdout.strip()


def mpirun_of(python):
    """The mpirun of `python`'s environment (Horovod was built against that MPI)."""
    candidate = os.path.join(os.path.dirname(python), "mpirun")
    return candidate if os.access(candidate, os.X_OK) else "mpirun"


def horovodrun_of(python):
    """The horovodrun of `python`'s environment (its Gloo launch)."""
    candidate = os.path.join(os.path.dirname(python), "horovodrun")
    return candidate if os.access(candidate, os.X_OK) else "horovodrun"


def environment(python, base=None):
    """`base` (default: os.environ) for a job of `python`'s environment: its bin first on
    PATH, no PYTHONPATH (this checkout's hvdcompat and its ``horovod`` alias stay out)."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
