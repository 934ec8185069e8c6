"""Runs an unmodified DDP script under an MPI launcher.

    mpirun -np 4 python -m hvdcompat.ddp train.py --epochs 3
    mpirun -np 4 python -m hvdcompat.ddp -m my_package.train --epochs 3

Importing :mod:`hvdcompat.ddp` fills RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the MPI world, then the
script runs as ``__main__`` with the remaining arguments.
"""

import os
import runpy
import sys

import hvdcompat.ddp  # noqa: F401  (the bootstrap runs on import)

_USAGE = "usage: python -m hvdcompat.ddp (script.py | -m module) [args ...]"


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE + "\n\n" + __doc__.strip())
        return 0 if argv else 2
    if argv[0] == "-m":
        if len(argv) < 2:
            print(_USAGE, file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        # As `python script.py` would: the script's folder comes first on the path.
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
