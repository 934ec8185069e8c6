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
whose daemons are the only ones whose loss the launcher believes. The
engine's own news of lost ranks (a survivor under --fault-tolerant) reaches
the supervisor on a pipe of its own (:data:`REPORT_FD_ENV`) and goes on as a
report of kind "lost"; the rank's output is not read for it.

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
import threading
import time

if __package__:  # imported as hvdcompat.runner.rank_supervisor
    from hvdcompat.runner import mpi_world
else:  # run as a script (above): the module beside this file, without the package
    import mpi_world

__all__ = ["MARKER", "TOKEN_ENV", "REPORT_FD_ENV", "report_marker", "main"]

MARKER = "hvdcompatrun-rank-exit: "
# The launch's report secret (hex), in the supervisors' environment only.
TOKEN_ENV = "HVDCOMPAT_REPORT_TOKEN"
# The write end of the supervisor's pipe, in the rank's environment: the
# engine writes the ranks it lost there (a knob of the core's table).
REPORT_FD_ENV = "HVDCOMPAT_REPORT_FD"


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
    rank = mpi_world.launch_rank()
    return -1 if rank is None else rank


def _write_report(marker, report):
    try:
        os.write(2, (marker + json.dumps(report) + "\n").encode())
    except OSError:
        pass  # the launcher is gone; the exit status still tells it


def _relay_engine_reports(read_fd, marker):
    """Passes the engine's lost-rank lines (JSON, one a line) on as reports of kind "lost"."""
    with os.fdopen(read_fd, "rb") as pipe:
        for line in pipe:
            try:
                lost = json.loads(line.decode("utf-8", "replace"))
            except ValueError:
                continue
            if not isinstance(lost, dict):
                continue
            ranks = [r for r in lost.get("ranks", []) if isinstance(r, int)]
            hosts = [h for h in lost.get("hosts", []) if isinstance(h, str)]
            if ranks:
                _write_report(marker, {"kind": "lost", "rank": _rank(), "ranks": ranks,
                                       "hosts": hosts})


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
    env = _place_environment(os.environ)
    pass_fds = ()
    if marker != MARKER:
        _write_report(marker, {"kind": "start", "rank": _rank(),
                               "namespace": os.environ.get("PMIX_NAMESPACE")})
        # Note [Report channel]: the engine's lost-rank lines come on a pipe of
        # their own, so a rank's output cannot pass for them.
        read_fd, write_fd = os.pipe()
        env[REPORT_FD_ENV] = str(write_fd)
        pass_fds = (write_fd,)
    try:
        child = subprocess.Popen(argv, preexec_fn=_die_with_parent, env=env, pass_fds=pass_fds)
    except OSError as e:
        print(f"hvdcompatrun: cannot start {argv[0]!r} on {socket.gethostname()}: {e}",
              file=sys.stderr, flush=True)
        return 127
    if pass_fds:
        os.close(pass_fds[0])
        relay = threading.Thread(target=_relay_engine_reports, args=(read_fd, marker),
                                 daemon=True)
        relay.start()

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
    if pass_fds:
        relay.join(timeout=2)  # the engine's last lines come before the exit report
    report = {"rank": _rank(), "host": socket.gethostname(), "time": time.time(),
              "status": code if code >= 0 else None, "signal": -code if code < 0 else None}
    _write_report(marker, report)
    _record_exit(report)
    if code > 0 and os.environ.get("HOROVOD_ELASTIC") == "1" and code != _RESTART_EXIT_CODE \
            and not os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        # Note [Failed elastic rank]: under ULFM, Open MPI 5.0's launcher ends
        # the whole job, survivors included, when a rank on another host than
        # mpirun's exits with a non-zero status; a rank killed by a signal is
        # a failure the survivors recover from. The report above keeps the
        # rank's own status for hvdcompatrun's summary. (hvdcompatrun --gloo
        # starts its workers itself: their status reaches it as it is.)
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
