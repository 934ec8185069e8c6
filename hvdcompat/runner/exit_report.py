"""The one line hvdcompatrun prints when a job fails: which rank failed first.

:class:`OutputRelay` copies mpirun's stdout and stderr to ours as they come,
taking out the report lines the rank supervisors write (Note [First failed
rank] in rank_supervisor.py), and watches for Open MPI's message about a
host it lost contact with. :func:`summary` turns what was seen into the line.
"""

import json
import os
import re
import select
import signal
import threading

from hvdcompat.runner.rank_supervisor import report_marker

# mpirun arguments that change where ranks go; the host list alone then does
# not say which ranks a lost host ran (expected_placement cannot be used).
MAPPING_ARGS = ("-npernode", "--npernode", "-N", "--map-by", "-map-by", "--rank-by",
                "-rank-by", "-ppr", "--ppr", "-rf", "--rankfile", "-bynode", "--bynode")

# OutputRelay(whole_lines=True): how long a partial line waits for the rest of it.
PARTIAL_LINE_SECONDS = 0.2

__all__ = ["OutputRelay", "summary", "expected_placement", "first_failure_code",
           "final_world_exit"]

# prterun: "PRTE has lost communication with a remote daemon. ... Remote daemon:
# [prterun-...@0,1] on node node2"; a daemon that died: "... on node node2 ...".
# The daemon's name is its job's namespace (before the "@"), then its number.
_LOST_HOST = re.compile(rb"^[ \t]*Remote daemon\s*:\s*\[?([^\s@\]]*)@[^\s\]]*\]? on node (\S+)",
                        re.MULTILINE)
# A rank whose MPI aborted it on an error (a survivor whose peer's connection
# closed, typically): "*** reported by process [1720975361,0]".
_MPI_ABORTED = re.compile(rb"\*\*\* reported by process \[\d+,(\d+)\]")
# The engine's error on a survivor (fault-tolerant MPI): "rank(s) 2, 3 on host
# n2 (which also runs rank(s) 4) failed".
_LOST_RANKS = re.compile(rb"rank\(s\) ([\d, ]+) on hosts? ([^ (]+(?:, [^ (]+)*?)"
                         rb"(?: \(which also runs rank\(s\) ([\d, ]+)\))? failed")


class OutputRelay:
    """Copies `streams` (mpirun's pipes) to our fds, filtering rank reports.

    Thread-safe: one thread per stream writes; :attr:`reports` and
    :attr:`lost_hosts` are read after :meth:`join`.

    With ``token`` (the launch's report secret, Note [Report channel] in
    rank_supervisor.py) only lines that carry it are reports, and a lost
    daemon counts only when it belongs to the Open MPI job a report named;
    whatever a rank prints is passed on as its output.
    """

    def __init__(self, pairs, token=None, whole_lines=False):
        """Args: pairs: (readable file object, our fd to write to); token: the report secret;
        whole_lines: write each stream's output a whole line at a time, so ranks writing to one
        fd never mix within a line (a partial line goes out once its stream is quiet for
        :data:`PARTIAL_LINE_SECONDS`)."""
        self.whole_lines = whole_lines
        self._marker = report_marker(token).encode()
        self._token = token
        self.reports = []
        self.namespaces = set()  # Open MPI jobs the reports named
        self._lost = []          # (namespace or None, host), in the order seen
        self.lost_ranks = set()
        self.lost_reporters = set()  # ranks whose engine reported a loss (a consequence)
        self.lost_named_by = {}      # host -> ranks whose engine reported it lost
        self._engine_lost = {}       # host -> the ranks on it an engine reported lost
        self.mpi_aborted = set()  # ranks MPI itself aborted on an error
        self.line_open = {}  # fd -> whether its output ends inside a line
        self._lock = threading.Lock()
        self._threads = []
        self.add(pairs)

    def add(self, pairs):
        """Relays more streams (a worker started later): (readable file object, our fd) pairs."""
        threads = [threading.Thread(target=self._pump, args=p, daemon=True) for p in pairs]
        with self._lock:
            self._threads += threads
        for t in threads:
            t.start()

    def join(self, timeout=None):
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout)

    def _pump(self, src, fd):
        pending = b""   # the start of a line that may be a report
        tail = b""      # recent output, to find prterun's lost-host message
        held = b""      # whole_lines: the end of the output, not yet a whole line
        while True:
            if held and not select.select([src], [], [], PARTIAL_LINE_SECONDS)[0]:
                _write_all(fd, held)  # a prompt or progress bar without a newline
                held = b""
            chunk = os.read(src.fileno(), 65536)
            if not chunk:
                break
            data = pending + chunk
            pending = b""
            out = []
            start = 0
            while start < len(data):
                nl = data.find(b"\n", start)
                line = data[start:] if nl < 0 else data[start:nl + 1]
                marker = self._marker
                if nl < 0 and (marker.startswith(line) or line.startswith(marker)):
                    pending = line  # wait for the rest of it
                    break
                at = line.find(marker)
                if at >= 0 and nl >= 0:
                    self._take_report(line[at + len(marker):])
                    out.append(line[:at])
                else:
                    out.append(line)
                start = len(data) if nl < 0 else nl + 1
            text = b"".join(out)
            if self.whole_lines:
                text, held = held + text, b""
                cut = text.rfind(b"\n") + 1
                if cut < len(text) and len(text) - cut < 65536:
                    text, held = text[:cut], text[cut:]
            if text:
                _write_all(fd, text)
                self.line_open[fd] = not text.endswith(b"\n")
                tail = (tail + text)[-8192:]
                self._scan(tail)
        if held or pending:
            _write_all(fd, held + pending)

    def _take_report(self, payload):
        try:
            report = json.loads(payload.decode("utf-8", "replace"))
        except ValueError:
            return
        if not isinstance(report, dict):
            return
        with self._lock:
            if report.get("kind") == "start":
                namespace = report.get("namespace")
                if isinstance(namespace, str) and "@" in namespace:
                    self.namespaces.add(namespace.rsplit("@", 1)[0])
            elif report.get("kind") == "lost":
                # A survivor's engine lost these ranks (Note [Report channel]).
                by = report.get("rank")
                if isinstance(by, int):
                    self.lost_reporters.add(by)
                    for h in report.get("hosts") or []:
                        if isinstance(h, str):
                            self.lost_named_by.setdefault(h, set()).add(by)
                ranks, hosts = report.get("ranks") or [], report.get("hosts") or []
                if len(ranks) == len(hosts):  # the host of each lost rank
                    self._record_lost([(None, h, [r]) for r, h in zip(ranks, hosts)
                                       if isinstance(h, str)])
                else:
                    self._record_lost([(None, h, ranks) for h in hosts if isinstance(h, str)])
            else:
                self.reports.append(report)

    @property
    def lost_hosts(self):
        """Hosts Open MPI (or the engine) lost contact with, in the order seen."""
        with self._lock:
            return self._lost_hosts()

    def _lost_hosts(self):
        hosts = []
        for namespace, host in self._lost:
            trusted = namespace is None or self._token is None or namespace in self.namespaces
            if trusted and host not in hosts:
                hosts.append(host)
        return hosts

    def _scan(self, tail):
        found = [(m.group(1).decode("utf-8", "replace"),
                  m.group(2).decode("utf-8", "replace").rstrip(".,"), ())
                 for m in _LOST_HOST.finditer(tail)]
        if self._token is None:
            # Without supervisors (no report channel) the engine's error in the
            # output is all there is; with them it comes as a "lost" report.
            for m in _LOST_RANKS.finditer(tail):
                ranks = [int(x) for x in
                         re.findall(rb"\d+", m.group(1) + b" " + (m.group(3) or b""))]
                for host in m.group(2).decode("utf-8", "replace").split(", "):
                    found.append((None, host, ranks))
        aborted = {int(m.group(1)) for m in _MPI_ABORTED.finditer(tail)}
        with self._lock:
            self.mpi_aborted.update(aborted)
            self._record_lost(found)

    def _record_lost(self, found):
        # Under self._lock: (namespace or None, host, ranks) of each loss seen.
        for namespace, host, ranks in found:
            if (namespace, host) not in self._lost:
                self._lost.append((namespace, host))
            ranks = {r for r in ranks if isinstance(r, int)}
            self.lost_ranks.update(ranks)
            if namespace is None:
                self._engine_lost.setdefault(host, set()).update(ranks)

    def survivors_done(self, np_ranks, placement=None, lost_hosts=None):
        """Whether every rank not on a lost host has ended (the rest cannot be reached).

        Only after some host was reported lost; `placement` ({host: [ranks]})
        adds the lost hosts' ranks when the launch fixed them; `lost_hosts`
        (with `placement`) narrows the hosts taken as lost (default: every one
        reported).
        """
        with self._lock:
            ended = {r.get("rank") for r in self.reports}
            # The ranks reported lost count too, unless the hosts are given: then those
            # hosts' ranks alone (a partitioned job's far side reports the near one lost).
            if lost_hosts is None:
                lost = self.lost_ranks - ended
                # A host only engines named, for ranks that have since ended, is not lost:
                # under ULFM a survivor that exits is a failed process to the others
                # (its supervisor's report shows it ended, through its host's daemon).
                by_open_mpi = {host for ns, host in self._lost if ns is not None}
                lost_hosts = [h for h in self._lost_hosts()
                              if h in by_open_mpi or not self._engine_lost.get(h, set()) <= ended]
            else:
                lost, lost_hosts = set(), list(lost_hosts)
            if not lost_hosts or np_ranks <= 0:
                return False
            for host in lost_hosts:
                lost.update((placement or {}).get(host, ()))
            return lost != set(range(np_ranks)) and set(range(np_ranks)) <= lost | ended


def _write_all(fd, data):
    while data:
        try:
            n = os.write(fd, data)
        except BrokenPipeError:
            return
        data = data[n:]


def expected_placement(hosts, np):
    """{host: [ranks]} for ``--map-by slot`` over `hosts` (hosts.Host list), or {}."""
    placement, rank = {}, 0
    for h in hosts:
        for _ in range(h.slots):
            if rank >= np:
                return placement
            placement.setdefault(h.name, []).append(rank)
            rank += 1
    return placement


def _how(report):
    if report.get("signal"):
        try:
            name = signal.Signals(report["signal"]).name
        except ValueError:
            name = f"signal {report['signal']}"
        return f"was killed by signal {report['signal']} ({name})"
    return f"exited with status {report.get('status')}"


def _first(reports, mpi_aborted=()):
    """The failure that came first: the earliest, except that ranks MPI aborted on an error
    (the consequence of a peer's failure) count only when no other rank failed."""
    failed = [r for r in reports if r.get("status") != 0]
    if not failed:
        return None
    return min(failed, key=lambda r: (r.get("rank") in mpi_aborted, r.get("time", 0)))


def first_failure_code(reports, mpi_aborted=()):
    """Exit code of the first failed rank (128 + signal when killed), or 0."""
    first = _first(reports, mpi_aborted)
    if first is None:
        return 0
    return first["status"] if first.get("status") else 128 + (first.get("signal") or 0)


def summary(code, reports, lost_hosts, placement=None, mpi_aborted=()):
    """The line naming the first failure, or None when the job succeeded or nothing is known.

    Args:
        code: the job's exit code.
        reports: rank supervisor reports (``rank``, ``host``, ``time``,
            ``status``/``signal``).
        lost_hosts: hosts Open MPI lost contact with, in the order seen.
        placement: {host: [ranks]} when the launch fixed it, for naming a lost
            host's ranks.
        mpi_aborted: ranks whose MPI aborted them on an error.
    """
    if code == 0:
        return None
    reports = [r for r in reports if r.get("status") != 0]
    if reports:
        first = _first(reports, mpi_aborted)
        others = len({r.get("rank") for r in reports}) - 1
        tail = (f"; {others} other rank(s) failed after it" if others > 0 else "")
        return (f"hvdcompatrun: rank {first.get('rank')} on host {first.get('host')} "
                f"{_how(first)}, the first rank of the job to fail{tail}; its own output above "
                f"says why (job exit code {code})")
    if lost_hosts:
        host = lost_hosts[0]
        ranks = (placement or {}).get(host)
        which = f" (rank(s) {', '.join(map(str, ranks))})" if ranks else ""
        return (f"hvdcompatrun: lost contact with host {host}{which}: its network link or the "
                f"host itself failed, and the job was stopped (job exit code {code})")
    return None


def final_world_exit(directory):
    """(exit code, world ranks) of the processes that ended in an elastic job's final world.

    Each such process leaves ``final.<world rank>`` in the elastic driver's
    ``directory`` at exit and its rank supervisor ``exit.<world rank>`` (how
    it ended). The code is the first non-zero exit status among them, in
    rank order; a rank ended by a signal counts only when none has a
    status (mpirun stops the others once one exits non-zero). None when no
    process marked itself.
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return None, []
    ranks = sorted(int(n.split(".", 1)[1]) for n in names
                   if n.startswith("final.") and n.split(".", 1)[1].isdigit())
    if not ranks:
        return None, []
    statuses, signals = [], []
    for rank in ranks:
        try:
            with open(os.path.join(directory, f"exit.{rank}")) as f:
                report = json.load(f)
        except (OSError, ValueError):
            continue
        if report.get("status") is not None:
            statuses.append(report["status"])
        elif report.get("signal"):
            signals.append(128 + report["signal"])
    code = next((c for c in statuses if c != 0), None)
    if code is None and not statuses:
        code = next(iter(signals), None)
    return code or 0, ranks
