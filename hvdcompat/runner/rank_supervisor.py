"""Runs one rank's command and reports how it ended, for hvdcompatrun.

    python .../hvdcompat/runner/rank_supervisor.py COMMAND [ARGS...]

hvdcompatrun starts every rank through this script (Note [First failed
rank]). It runs COMMAND as its child, passes on every signal it receives,
and when the child ends writes one report line to stderr (see
:data:`MARKER`) before ending the same way, so the launcher still sees the
rank's own exit status.

Note [First failed rank]: once one rank of an Open MPI job fails, the others
fail too (a survivor's MPI aborts on the closed connection), and Open MPI's
summary names whichever failure it processed first, often a survivor
("process rank 0 ... calling abort"). The parent of the rank is the only
process that knows for certain when and how the rank ended; the launcher
collects these reports from the job's output, removes them from it, and
names the earliest.

Note [Report channel]: the reports travel in the job's output, which the
ranks write too, so a rank's own output must not pass for one (a rank that
prints a report line could change the job's exit code or get a live job
stopped). hvdcompatrun gives the supervisors a fresh secret for each launch
(:data:`TOKEN_ENV`, forwarded by name only, so no command line shows it);
the supervisor takes it out of the rank's environment before starting it and
puts it in every report's marker (:func:`report_marker`). The launcher takes
only lines that carry it as reports; the rest is the ranks' output. A
supervisor also writes a start report naming its Open MPI job (namespace),
whose daemons are the only ones whose loss the launcher believes.

Run as a script, not as ``-m hvdcompat...``: importing the package would
import torch in every supervisor.
"""

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time

if __package__:  # imported as hvdcompat.runner.rank_supervisor
    from hvdcompat.runner import mpi_world
else:  # run as a script (above): the module beside this file, without the package
    import mpi_world

__all__ = ["MARKER", "TOKEN_ENV", "report_marker", "main"]

MARKER = "hvdcompatrun-rank-exit: "
# The launch's report secret (hex), in the supervisors' environment only.
TOKEN_ENV = "HVDCOMPAT_REPORT_TOKEN"


def report_marker(token):
    """What starts a report line for the launch whose secret is ``token`` (MARKER without one)."""
    return f"hvdcompatrun-rank-exit-{token}: " if token else MARKER

_PR_SET_PDEATHSIG = 1
# hvdcompat.elastic.loop.RESTART_EXIT_CODE (not imported: no torch here).
_RESTART_EXIT_CODE = 75
# Every signal a launcher or user may send a rank, passed on unchanged.
_FORWARDED = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
              signal.SIGUSR2, signal.SIGCONT, signal.SIGTSTP, signal.SIGWINCH]


def _die_with_parent():
    # If the supervisor is SIGKILLed (the launcher's last resort), the rank
    # must not outlive it.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _rank():
    # HOROVOD_RANK: hvdcompatrun --gloo starts the rank itself.
    rank = mpi_world.read(mpi_world.RANK + ("HOROVOD_RANK",))
    return -1 if rank is None else rank


def _write_report(marker, report):
    try:
        os.write(2, (marker + json.dumps(report) + "\n").encode())
    except OSError:
        pass  # the launcher is gone; the exit status still tells it


def _record_exit(report):
    """In an elastic launch, leaves the rank's ending in the driver's directory.

    ElasticDriver.verdict takes the job's exit code from the ranks that
    ended in the final world (which they mark themselves at exit): a
    ``sys.exit(N)`` there is the job's N, even though mpirun's own code
    may be a lost rank's.
    """
    directory = os.environ.get("HVDCOMPAT_ELASTIC_DIR")
    if not directory or report["rank"] < 0:
        return
    try:
        with open(os.path.join(directory, f"exit.{report['rank']}"), "w") as f:
            json.dump(report, f)
    except OSError:
        pass  # the driver is gone: nobody to tell


# Horovod's launcher gives each worker its place in the job as HOROVOD_*
# variables, and scripts read them (an elastic script's HOROVOD_RANK is the
# rank it started as). The same names, from what the MPI launcher sets.
_PLACE = (
    ("HOROVOD_RANK", mpi_world.RANK),
    ("HOROVOD_SIZE", mpi_world.SIZE),
    ("HOROVOD_LOCAL_RANK", mpi_world.LOCAL_RANK),
    ("HOROVOD_LOCAL_SIZE", mpi_world.LOCAL_SIZE),
)


def _place_environment(environ):
    """`environ` with Horovod's per-worker variables added where unset."""
    env = dict(environ)
    for name, sources in _PLACE:
        if name in env:
            continue
        value = mpi_world.read(sources, env)
        if value is not None:
            env[name] = str(value)
    # The host as the job's host list names it (elastic launches say it), else the machine's.
    env.setdefault("HOROVOD_HOSTNAME", env.get("HVDCOMPAT_ELASTIC_HOST") or socket.gethostname())
    return env


def main(argv=None):
    """Runs ``argv`` (default ``sys.argv[1:]``); returns or re-raises its ending."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        print("rank_supervisor: no command given", file=sys.stderr)
        return 2
    marker = report_marker(os.environ.pop(TOKEN_ENV, None))  # the rank never sees it
    if marker != MARKER:
        _write_report(marker, {"kind": "start", "rank": _rank(),
                               "namespace": os.environ.get("PMIX_NAMESPACE")})
    try:
        child = subprocess.Popen(argv, preexec_fn=_die_with_parent,
                                 env=_place_environment(os.environ))
    except OSError as e:
        print(f"hvdcompatrun: cannot start {argv[0]!r} on {socket.gethostname()}: {e}",
              file=sys.stderr, flush=True)
        return 127

    def forward(signum, _frame):
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    report = {"rank": _rank(), "host": socket.gethostname(), "time": time.time(),
              "status": code if code >= 0 else None, "signal": -code if code < 0 else None}
    _write_report(marker, report)
    _record_exit(report)
    if code > 0 and os.environ.get("HOROVOD_ELASTIC") == "1" and code != _RESTART_EXIT_CODE:
        # Note [Failed elastic rank]: under ULFM, Open MPI 5.0's launcher ends
        # the whole job, survivors included, when a rank on another host than
        # mpirun's exits with a non-zero status; a rank killed by a signal is
        # a failure the survivors recover from. The report above keeps the
        # rank's own status for hvdcompatrun's summary.
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(1)
    if code < 0:
        # End the way the rank did, so the launcher reports the same signal.
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main())
