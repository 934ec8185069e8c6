"""Settings read by the Python package come from the core's knob table
(cpp/core/env.cc), with the same precedence as the engine's own."""

import json
import os
import subprocess
import sys

from hvdcompat.basics import _core

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# suffix -> (Horovod spelling, default)
PYTHON_SIDE = {
    "WAIT_SPIN_MICROS": (None, "100"),
    "GPU_OPERATIONS": ("HOROVOD_GPU_OPERATIONS", "NCCL"),
    "ELASTIC": ("HOROVOD_ELASTIC", "0"),
    "DDP_ACCELERATE": (None, "1"),
    "DDP_COMPRESSION": (None, "none"),
    "DDP_ROUTE": (None, "auto"),
    "DDP_FUSION_THRESHOLD": (None, "0"),
    "START_TIMEOUT": ("HOROVOD_START_TIMEOUT", "30"),
    "GLOO_TIMEOUT_SECONDS": ("HOROVOD_GLOO_TIMEOUT_SECONDS", "30"),
    "MPIRUN": (None, ""),
}


def test_the_settings_read_outside_the_engine_are_declared_once_in_the_core():
    declared = {k["name"]: k for k in _core.knobs()}
    for suffix, (horovod, default) in PYTHON_SIDE.items():
        k = declared["HVDCOMPAT_" + suffix]
        assert (k["horovod_name"] or None, k["default"]) == (horovod, default), suffix


_PROBE = """
import json
from hvdcompat import _gpu
from hvdcompat.basics import _core
from hvdcompat.ddp import accelerate, hooks
from hvdcompat.runner import run_func
print(json.dumps({
    "gpu_operations_mpi": _gpu._gpu_operations_mpi(),
    "elastic": _core.setting("ELASTIC"),
    "start_timeout": run_func._start_timeout(None),
    "settings": list(accelerate.settings()),
    "accelerated": accelerate.is_enabled(),
    "fusion": hooks.HookState().fusion_threshold,
}))
"""


def _probe(env):
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("HVDCOMPAT_", "HOROVOD_"))}
    clean.update(env, PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=clean, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_python_settings_follow_the_knob_rules():
    # Defaults, then both spellings; HVDCOMPAT_ wins over HOROVOD_.
    assert _probe({}) == {"gpu_operations_mpi": False, "elastic": False, "start_timeout": 30.0,
                          "settings": ["none", "auto"], "accelerated": True, "fusion": 0}
    got = _probe({"HOROVOD_GPU_OPERATIONS": "mpi", "HOROVOD_ELASTIC": "1",
                  "HVDCOMPAT_DDP_COMPRESSION": "BF16", "HVDCOMPAT_DDP_ROUTE": "engine",
                  "HVDCOMPAT_DDP_ACCELERATE": "0", "HVDCOMPAT_DDP_FUSION_THRESHOLD": "4096"})
    assert got == {"gpu_operations_mpi": True, "elastic": True, "start_timeout": 30.0,
                   "settings": ["bf16", "engine"], "accelerated": False, "fusion": 4096}
    # Where Python used to parse by its own rules, the table's rules now hold: "true" is on
    # (optimizer.py compared == "1"), "" is off (accelerate.py took it as on), "1e3" is a
    # number of bytes (hooks.py took only int()), and HOROVOD_START_TIMEOUT is a knob.
    got = _probe({"HOROVOD_ELASTIC": "true", "HVDCOMPAT_DDP_ACCELERATE": "",
                  "HVDCOMPAT_DDP_FUSION_THRESHOLD": "1e3", "HOROVOD_START_TIMEOUT": "12.5"})
    assert (got["elastic"], got["accelerated"], got["fusion"], got["start_timeout"]) == \
        (True, False, 1000, 12.5)
    got = _probe({"HOROVOD_GPU_OPERATIONS": "MPI", "HVDCOMPAT_GPU_OPERATIONS": "NCCL"})
    assert got["gpu_operations_mpi"] is False


def test_the_core_hands_back_typed_values():
    import pytest

    setting = _core.setting
    kinds = {k["name"]: k["kind"] for k in _core.knobs()}
    assert kinds["HVDCOMPAT_ELASTIC"] == "bool" and kinds["HVDCOMPAT_GPU_OPERATIONS"] == "choice"
    assert kinds["HVDCOMPAT_FUSION_THRESHOLD"] == "int" and kinds["HVDCOMPAT_CYCLE_TIME"] == "float"
    assert kinds["HVDCOMPAT_MPIRUN"] == "text"
    # bool: the table's spellings in any case; "" is off.
    for value, expected in (("1", True), ("TRUE", True), ("on", True), ("0", False),
                            ("no", False), ("", False)):
        assert setting("ELASTIC", {"HOROVOD_ELASTIC": value}) is expected, value
    with pytest.raises(ValueError, match="HOROVOD_ELASTIC=maybe is not valid"):
        setting("ELASTIC", {"HOROVOD_ELASTIC": "maybe"})
    # numbers: HVDCOMPAT_ wins over HOROVOD_; "" is the default; unset without a default: None.
    assert setting("FUSION_THRESHOLD", {"HOROVOD_FUSION_THRESHOLD": "7",
                                        "HVDCOMPAT_FUSION_THRESHOLD": "9"}) == 9
    assert setting("FUSION_THRESHOLD", {"HOROVOD_FUSION_THRESHOLD": ""}) == 134217728
    assert setting("FUSION_THRESHOLD", {"HOROVOD_FUSION_THRESHOLD": "2.9"}) == 2
    assert setting("CYCLE_TIME", {"HOROVOD_CYCLE_TIME": "0.5"}) == 0.5
    assert setting("ELASTIC_MIN_NP", {}) is None
    assert setting("ELASTIC_MIN_NP", {"HVDCOMPAT_ELASTIC_MIN_NP": "3"}) == 3
    with pytest.raises(ValueError, match="HOROVOD_START_TIMEOUT=-1 is not valid"):
        setting("START_TIMEOUT", {"HOROVOD_START_TIMEOUT": "-1"})
    # choices: any case, handed back as the table spells them; "" is the default.
    assert setting("GPU_OPERATIONS", {"HOROVOD_GPU_OPERATIONS": "mpi"}) == "MPI"
    assert setting("DDP_ROUTE", {"HVDCOMPAT_DDP_ROUTE": ""}) == "auto"
    with pytest.raises(ValueError, match="expected none, fp16 or bf16"):
        setting("DDP_COMPRESSION", {"HVDCOMPAT_DDP_COMPRESSION": "fp8"})
    assert setting("MPIRUN", {"HVDCOMPAT_MPIRUN": "/opt/mpi/bin/mpirun"}) == "/opt/mpi/bin/mpirun"
    with pytest.raises(KeyError, match="NO_SUCH"):
        setting("NO_SUCH")
