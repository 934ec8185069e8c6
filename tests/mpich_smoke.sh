#!/usr/bin/env bash
# Builds hvdcompat against MPICH (the `mpich` PyPI wheel) out of tree and runs
# parallel test files on it at 2 and 3 ranks (and the hierarchical file at 4),
# launched through MPICH's mpiexec (Hydra).
#
#   bash tests/mpich_smoke.sh              # the smoke subset (CI runs this)
#   bash tests/mpich_smoke.sh --all        # every tests/parallel file
#
# Needs only PyPI: the environment (a virtualenv that sees this Python's
# packages — torch, pytest, mpi4py — plus the mpich wheel) and the build are
# cached under $HVDCOMPAT_MPICH_CACHE (default ~/.cache/hvdcompat-mpich), so a
# rerun only recompiles what changed. The main environment's MPI is untouched.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
MPICH_VERSION="${HVDCOMPAT_MPICH_VERSION:-5.0.2}"
CACHE="${HVDCOMPAT_MPICH_CACHE:-$HOME/.cache/hvdcompat-mpich}"
# The interpreter whose packages (torch, pytest, ...) the MPICH environment
# uses: the one running the tests (tests/test_mpich.py passes it), which may
# be a virtualenv's.
PYTHON="${PYTHON:-python3}"
PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
VENV="$CACHE/venv-mpich-$MPICH_VERSION-py$PYVER"
TREE="$CACHE/tree"

say() { echo "[mpich-smoke] $*"; }

if [ ! -x "$VENV/bin/mpicc" ]; then
  say "creating $VENV with mpich==$MPICH_VERSION"
  rm -rf "$VENV"
  "$PYTHON" -m venv --system-site-packages "$VENV"
  "$VENV/bin/python" -m pip install -q "mpich==$MPICH_VERSION"
fi
# --system-site-packages sees the base interpreter's packages only, never a
# virtualenv's: list $PYTHON's own site-packages after the environment's own
# (written at every run, so a cached environment follows the interpreter).
# Plain directories, not site.addsitedir: their .pth files (an editable
# hvdcompat among them) must not put the other build of hvdcompat on the path.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$PYTHON" -c 'import site, sys; print("\n".join(p for p in site.getsitepackages()
                                               if p != sys.argv[1]))' "$SITE" \
  > "$SITE/hvdcompat_parent_site.pth"
export PATH="$VENV/bin:$PATH"
export MPICC="$VENV/bin/mpicc"

# mpi4py must run on the same MPI as the core. Its PyPI wheel carries an
# MPICH build and picks the MPI installed in the active prefix (the venv);
# an mpi4py compiled against another MPI is replaced by that wheel here.
if ! "$VENV/bin/python" -c "from mpi4py import MPI; import sys; \
    sys.exit(0 if MPI.Get_library_version().startswith('MPICH') else 1)" 2>/dev/null; then
  say "installing the mpi4py wheel into $VENV"
  "$VENV/bin/python" -m pip install -q --ignore-installed --no-deps --only-binary mpi4py mpi4py
fi

# Out-of-tree copy: the checkout's own build (against its MPI) stays as it is.
# tar keeps modification times, so unchanged sources are not recompiled.
mkdir -p "$TREE"
if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$REPO" && git ls-files -co --exclude-standard -z | tar --null -cf - -T -) | tar -xf - -C "$TREE"
  # Sources the checkout no longer has (moved or deleted) must not linger in
  # the copy: the build globs its source folders.
  (cd "$REPO" && git ls-files -co --exclude-standard -z) | "$PYTHON" -c '
import os, sys
keep = set(sys.stdin.buffer.read().decode().split("\0"))
tree = sys.argv[1]
for top in ("cpp", "hvdcompat", "tests", "third_party", "examples"):
    for root, dirs, files in os.walk(os.path.join(tree, top)):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", "build")]
        for f in files:
            path = os.path.join(root, f)
            rel = os.path.relpath(path, tree)
            if rel not in keep and not f.endswith((".so", ".pyc")):
                os.remove(path)
' "$TREE"
else
  (cd "$REPO" && tar --exclude=./build --exclude='*.so' -cf - .) | tar -xf - -C "$TREE"
fi
say "building against $("$VENV/bin/mpichversion" | head -1 | tr -s ' ')"
(cd "$TREE" && "$VENV/bin/python" setup.py -q build_ext --inplace >"$CACHE/build.log" 2>&1) || {
  cat "$CACHE/build.log"; say "build against MPICH failed (log above)"; exit 1; }

cd "$TREE"
"$VENV/bin/python" - <<'EOF'
import hvdcompat as hvd
from mpi4py import MPI
lib = hvd.build_info()["mpi_library"]
assert lib.startswith("MPICH"), f"the core is built against {lib.splitlines()[0]!r}, not MPICH"
assert MPI.Get_library_version().startswith("MPICH"), "mpi4py does not run on MPICH"
print("[mpich-smoke] core and mpi4py on", " ".join(lib.splitlines()[0].split()))
EOF

if [ "${1:-}" = "--all" ]; then
  SELECT=(tests/test_parallel.py tests/test_hierarchical.py)
else
  export HVDCOMPAT_TEST_PARALLEL_FILES="test_allreduce.py,test_topology.py,test_hierarchical.py"
  SELECT=(tests/test_parallel.py tests/test_hierarchical.py)
fi
say "running ${SELECT[*]} under $(command -v mpiexec)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "${SELECT[@]}"
