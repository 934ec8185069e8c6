"""``python -m hvdcompat.horovod_alias SCRIPT [ARGS...]`` (or ``-m MODULE [ARGS...]``).

Runs an unmodified Horovod script on hvdcompat: ``import horovod`` and
``import horovod.torch as hvd`` resolve to hvdcompat in this process (and in
the ranks of a ``horovod.run`` job it starts). Refuses when a real Horovod is
installed. Under a launcher: ``hvdcompatrun -np 2 python -m
hvdcompat.horovod_alias train.py``.
"""

import os
import runpy
import sys

from hvdcompat import horovod_alias

__all__ = ["main"]

_USAGE = ("usage: python -m hvdcompat.horovod_alias SCRIPT [ARGS...]\n"
          "       python -m hvdcompat.horovod_alias -m MODULE [ARGS...]\n"
          "Runs a Horovod script unchanged on hvdcompat (import horovod -> hvdcompat).")


def main(argv=None):
    """Runs the script or module named in ``argv``; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "-m" and len(argv) < 2:
        print("hvdcompat.horovod_alias: -m needs a module name\n" + _USAGE, file=sys.stderr)
        return 2
    if argv[0] != "-m" and not os.path.isfile(argv[0]):
        print(f"hvdcompat.horovod_alias: script {argv[0]!r} does not exist (looked in "
              f"{os.getcwd()})", file=sys.stderr)
        return 2
    try:
        horovod_alias.install()
    except horovod_alias.HorovodInstalledError as e:
        print(e, file=sys.stderr)
        return 2
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        # As `python SCRIPT` does: the script's directory comes first on sys.path.
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
