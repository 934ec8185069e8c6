"""The processes ``hvdcompatrun --gloo`` starts: each worker's process, its output, its end.

A :class:`WorkerPool` starts workers (a local process, or ``ssh`` for another
host, each under the rank supervisor; hvdcompat/runner/gloo_run.py builds
their command and environment), copies their output to ours a whole line at
a time, takes out the supervisors' reports, and waits for them. Workers may
be started while others run (an elastic job growing in place,
hvdcompat/runner/elastic/gloo_driver.py).
"""

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from hvdcompat.runner import exit_report as _exit_report

__all__ = ["Worker", "WorkerPool", "stop_processes"]


@dataclass
class Worker:
    """One started worker process."""

    number: int          # its rank at the launch, or the next number for one started later
    host: str
    proc: subprocess.Popen
    joining: bool = False  # started to join a running elastic job (not yet in its world)
    stopped: bool = False  # the launcher stopped it (its end is no failure)
    ended: Optional[float] = None  # time.time() when its end was seen
    reported: bool = field(default=False, repr=False)  # its end was handed to the driver

    @property
    def code(self) -> Optional[int]:
        """Its exit code (128 + signal when killed), None while it runs."""
        rc = self.proc.poll()
        if rc is None:
            return None
        return rc if rc >= 0 else 128 - rc


def stop_processes(procs, grace=5):
    """SIGTERM, then after `grace` seconds SIGKILL, the processes of `procs` still running."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for p in alive:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


def _tee_fd(target_fd, copy):
    """A pipe whose data goes to `target_fd` and to file `copy` (a thread copies it)."""
    r, w = os.pipe()

    def pump():
        with os.fdopen(r, "rb", buffering=0) as src:
            while True:
                data = src.read(65536)
                if not data:
                    break
                _exit_report._write_all(target_fd, data)
                copy.write(data)
                copy.flush()
        copy.close()

    threading.Thread(target=pump, daemon=True).start()
    return w


class WorkerPool:
    """Starts workers, relays their output and reports, and waits for them.

    Thread-safe: :meth:`start`, :meth:`stop` and the queries may be called
    from the elastic driver's thread while :meth:`wait` runs.

    Args:
        token: the launch's report secret (Note [Report channel] in
            rank_supervisor.py): in a local worker's environment, on a remote
            one's ssh standard input.
        output_dir: --output-filename: each worker's output also goes to
            DIR/rank.N/stdout and stderr (N its number).
    """

    def __init__(self, token, output_dir=None):
        self.token = token
        self.output_dir = output_dir
        self.workers = []
        self._lock = threading.RLock()
        # Every worker writes to our stdout/stderr: whole lines, so they never mix within one.
        self.relay = _exit_report.OutputRelay([], token=token, whole_lines=True)

    def start(self, number, host, argv, env, local, joining=False):
        """Starts one worker; returns its :class:`Worker`.

        Raises:
            OSError: the process (or ssh) could not be started.
        """
        proc = subprocess.Popen(argv, env=env if local else None, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL if local else subprocess.PIPE,
                                start_new_session=True)
        if not local:
            try:  # the secret on ssh's standard input, then EOF
                proc.stdin.write((self.token + "\n").encode())
                proc.stdin.close()
            except OSError:
                pass  # ssh already ended: its end is reported
        out_fd, err_fd = sys.stdout.fileno(), sys.stderr.fileno()
        if self.output_dir:
            path = os.path.join(self.output_dir, f"rank.{number}")
            os.makedirs(path, exist_ok=True)
            out_fd = _tee_fd(out_fd, open(os.path.join(path, "stdout"), "wb"))
            err_fd = _tee_fd(err_fd, open(os.path.join(path, "stderr"), "wb"))
        self.relay.add([(proc.stdout, out_fd), (proc.stderr, err_fd)])
        worker = Worker(number, host, proc, joining=joining)
        with self._lock:
            self.workers.append(worker)
        return worker

    def running(self):
        """The workers still running."""
        with self._lock:
            return [w for w in self.workers if w.proc.poll() is None]

    def stop(self, workers, grace=5):
        """Stops `workers` (their ends are not failures); returns once they ended."""
        for w in workers:
            w.stopped = True
        stop_processes([w.proc for w in workers], grace)

    def wait(self, tick=None, stop_on_failure=True, grace=10, survivors_done=None):
        """Waits for every worker, forwarding SIGINT/SIGTERM to them; returns the exit code.

        Args:
            tick: called every 0.1 s while workers run (the elastic driver's
                look at them; it may start or stop workers).
            stop_on_failure: after the first failure, give the others
                `grace` seconds to notice and end on their own, then stop
                them (a static launch; an elastic job's survivors go on).
            survivors_done: once it returns True (every rank off the hosts the
                engines reported lost has ended), the rest get `grace` seconds,
                then are stopped (an ``ssh`` to a host that dropped off the
                network may not end for minutes).

        Returns:
            0, or the first failed worker's code (128 + signal when killed).
        """
        def forward(signum, _frame):
            for w in self.running():
                try:
                    w.proc.send_signal(signum)
                except ProcessLookupError:
                    pass

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        first = 0
        failed_at = done_at = None
        try:
            while self.running():
                now = time.time()
                for w in list(self.workers):
                    if w.ended is None and w.proc.poll() is not None:
                        w.ended = now
                if survivors_done is None or not survivors_done():
                    done_at = None
                elif done_at is None:
                    done_at = time.monotonic()
                elif time.monotonic() - done_at > grace:
                    self.stop(self.running())
                    break
                if failed_at is None:
                    for w in list(self.workers):
                        code = w.code
                        if code not in (None, 0) and not w.stopped:
                            first, failed_at = code, time.monotonic()
                            break
                elif stop_on_failure and time.monotonic() - failed_at > grace:
                    self.stop(self.running())
                    break
                if tick is not None:
                    tick()
                time.sleep(0.1)
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        if not first:
            first = next((w.code for w in self.workers if w.code and not w.stopped), 0)
        self.relay.join(timeout=5)
        return first
