"""One rank of a :func:`hvdcompat.run` job.

    python -m hvdcompat.runner.run_task --driver HOST[,HOST...]:PORT [--horovod-alias]

``hvdcompat.run`` starts this on every rank through mpirun. It connects to
the driver (see Note [Run channel] in ``hvdcompat/runner/common/channel.py``), says
which rank it is, receives the pickled function, runs it and sends back the
return value, or the exception and its traceback.

A rank whose function raised leaves with ``os._exit(1)`` as soon as the
report is sent: its peers may be blocked in a collective it will never join,
and a normal exit would wait in the engine's shutdown; the non-zero exit
makes mpirun end the whole job instead.
"""

import argparse
import os
import socket
import sys
import traceback

import cloudpickle

from hvdcompat.runner.common import channel
from hvdcompat.runner import mpi_world

__all__ = ["world_rank", "main"]


def world_rank(environ=None):
    """This process's rank in the MPI world, read from the launcher's variables.

    Raises:
        RuntimeError: the process was not started by an MPI launcher.
    """
    rank = mpi_world.world_rank(environ)
    if rank is not None:
        return rank
    environ = os.environ if environ is None else environ
    if environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR") and environ.get("HOROVOD_RANK", "").isdigit():
        return int(environ["HOROVOD_RANK"])  # hvdcompat.run(use_gloo=True): hvdcompatrun --gloo
    raise RuntimeError("hvdcompat.runner.run_task: no MPI rank in the environment (none of "
                       + ", ".join(mpi_world.RANK) + " is set, nor HOROVOD_RANK under "
                       "hvdcompatrun --gloo); it is started by hvdcompat.run, not by hand")


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m hvdcompat.runner.run_task")
    parser.add_argument("--driver", required=True, metavar="HOST[,HOST...]:PORT")
    parser.add_argument("--start-timeout", type=float, default=30.0)
    parser.add_argument("--horovod-alias", action="store_true",
                        help="make `import horovod` resolve to hvdcompat before unpickling")
    args = parser.parse_args(argv)
    hosts, _, port = args.driver.rpartition(":")
    return args, [h for h in hosts.split(",") if h], int(port)


def _report_failure(conn, rank, exc):
    try:
        exc_pickle = cloudpickle.dumps(exc)
    except Exception:  # an exception that cannot travel: its text and traceback still do
        exc_pickle = None
    conn.send({"kind": "error", "rank": rank, "type": type(exc).__name__, "message": str(exc),
               "traceback": traceback.format_exc(), "exception": exc_pickle})


def _final_place():
    """[rank, size] in hvdcompat's current world, or None when it is not running here.

    In an elastic job a reset may have renumbered this rank; the driver
    orders the values of the final world by these ranks.
    """
    basics = sys.modules.get("hvdcompat.basics")  # never import torch just to ask
    try:
        if basics is not None and basics.is_initialized():
            return [basics.rank(), basics.size()]
    except Exception:  # noqa: BLE001 - a broken runtime simply has no place to report
        pass
    return None


def main(argv=None):
    """Runs this rank's share of the job; returns the exit code."""
    args, hosts, port = _parse(sys.argv[1:] if argv is None else argv)
    secret = bytes.fromhex(os.environ.pop(channel.SECRET_ENV, ""))
    if not secret:
        print(f"hvdcompat.runner.run_task: {channel.SECRET_ENV} is not set; this module is started by "
              "hvdcompat.run, not by hand", file=sys.stderr)
        return 2
    rank = world_rank()
    conn = channel.connect(hosts, port, secret, args.start_timeout)
    conn.send({"kind": "hello", "rank": rank, "host": socket.gethostname(), "pid": os.getpid()})
    payload = conn.recv_bytes()
    try:
        if args.horovod_alias:
            from hvdcompat import horovod_alias

            horovod_alias.install()
        func, call_args, call_kwargs = cloudpickle.loads(payload)
        value = func(*call_args, **call_kwargs)
        try:
            result = cloudpickle.dumps(value)
        except Exception as e:
            raise TypeError(f"hvdcompat.run: the function's return value on rank {rank} "
                            f"({type(value).__name__}) cannot be pickled: {e}") from e
    except BaseException as e:  # SystemExit and KeyboardInterrupt are reported too
        _report_failure(conn, rank, e)
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    conn.send({"kind": "result", "rank": rank, "value": result, "final": _final_place()})
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
