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
print(json.dumps({
    "gpu_operations_mpi": _gpu._gpu_operations_mpi(),
    "elastic": _core.knob("ELASTIC"),
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
    assert _probe({}) == {"gpu_operations_mpi": False, "elastic": "0",
                          "settings": ["none", "auto"], "accelerated": True, "fusion": 0}
    got = _probe({"HOROVOD_GPU_OPERATIONS": "mpi", "HOROVOD_ELASTIC": "1",
                  "HVDCOMPAT_DDP_COMPRESSION": "BF16", "HVDCOMPAT_DDP_ROUTE": "engine",
                  "HVDCOMPAT_DDP_ACCELERATE": "0", "HVDCOMPAT_DDP_FUSION_THRESHOLD": "4096"})
    assert got == {"gpu_operations_mpi": True, "elastic": "1", "settings": ["bf16", "engine"],
                   "accelerated": False, "fusion": 4096}
    got = _probe({"HOROVOD_GPU_OPERATIONS": "MPI", "HVDCOMPAT_GPU_OPERATIONS": "NCCL"})
    assert got["gpu_operations_mpi"] is False
