"""The elastic launch of :func:`hvdcompat.run`: any of its elastic parameters makes a job elastic.

The parameters become hvdcompatrun's elastic flags (:func:`elastic_options`)
and the job runs under hvdcompatrun's elastic driver (:func:`launch`), so it
is launched as ``hvdcompatrun --min-np ... python -m hvdcompat.runner.run_task``
would be. A rank whose training inside ``hvd.elastic.run`` fails leaves the
job and the others continue without it; the values :func:`hvdcompat.run` returns are the final world's
(:func:`final_reports`). The job itself is :mod:`hvdcompat.runner.run_job`'s, as in
the plain launch.
"""

import os
import subprocess
import threading

from hvdcompat.runner import run_job
from hvdcompat.runner import mpi_session as _mpi_session
from hvdcompat.exceptions import HorovodInternalError

__all__ = ["ELASTIC_PARAMETERS", "elastic_options", "discovered_hosts", "launch", "final_reports"]

# Parameters that only an elastic job uses (Horovod: any of them makes the job elastic); the
# last two are hvdcompat's, for hvdcompatrun's flags of the same names.
ELASTIC_PARAMETERS = ("min_num_proc", "max_num_proc", "slots", "reset_limit", "cooldown_range",
                      "host_discovery_script", "elastic_timeout")


def elastic_options(settings, hosts, hostfile):
    """hvdcompatrun's elastic flag tokens for :func:`hvdcompat.run`'s elastic parameters.

    Raises:
        ValueError: a value of the wrong kind, or parameters that exclude each other.
    """
    tokens = []
    for param, flag in (("min_num_proc", "--min-np"), ("max_num_proc", "--max-np"),
                        ("slots", "--slots-per-host"), ("reset_limit", "--reset-limit"),
                        ("elastic_timeout", "--elastic-timeout")):
        value = settings.get(param)
        if value is None:
            continue
        low = 0 if param in ("reset_limit", "elastic_timeout") else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"hvdcompat.run: {param} must be a whole number >= {low}, got "
                             f"{value!r}")
        tokens.append(f"{flag}={value}")
    cooldown = settings.get("cooldown_range")
    if cooldown is not None:
        try:
            low, high = cooldown
        except (TypeError, ValueError):
            low = high = None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) \
                or not 0 <= low <= high:
            raise ValueError(f"hvdcompat.run: cooldown_range must be a pair (MIN, MAX) of whole "
                             f"seconds with 0 <= MIN <= MAX, got {cooldown!r}")
        tokens += ["--blacklist-cooldown-range", str(low), str(high)]
    script = settings.get("host_discovery_script")
    if script is not None:
        if hosts is not None or hostfile is not None:
            raise ValueError("hvdcompat.run: host_discovery_script replaces hosts/hostfile "
                             "(the script's output is the host list); give one of them")
        tokens.append(f"--host-discovery-script={os.fspath(script)}")
    return tokens


def discovered_hosts(options):
    """The hosts the discovery script offers now (for the addresses the ranks call back on)."""
    from hvdcompat.runner.elastic import discovery as _discovery
    from hvdcompat.runner import hosts as _hosts

    try:
        return _discovery.discover(options.host_discovery_script, options.slots_per_host)
    except _hosts.HostListError as e:
        raise ValueError(f"hvdcompat.run: {e}") from None


def launch(options, listener, job, secret, timeout, addresses, executable, output_filename,
           verbose):
    """Runs the job under hvdcompatrun's elastic driver; returns mpirun's exit code."""
    from hvdcompat.runner.elastic.mpi_driver import MpiElasticDriver

    codes = []

    def plan(extra_env, hosts=None):
        if hosts is not None:
            from hvdcompat.runner.errors import LaunchError

            # Growth restarts every worker from the last commit, which would call
            # `func` again in new processes whose values this call cannot pair
            # with the first launch's.
            raise LaunchError(
                "hvdcompat.run: hosts were added to the elastic job, and growing restarts every "
                "worker, which hvdcompat.run does not support; run the training script under "
                "hvdcompatrun's elastic flags (--host-discovery-script, --min-np, --max-np) to "
                "let a job grow, or give hvdcompat.run a discovery script that only removes hosts.")
        return run_job.plan(options, listener.port, addresses, secret, timeout, executable,
                            output_filename, extra_env)

    def launch_ranks(cmd, env, placement=None, np_ranks=0, abort=None, summarize=None):
        job.num_proc = options.planned_np
        listener.start()
        # Note [Session directory of a killed mpirun]
        _mpi_session.remove_stale(_mpi_session.session_base(cmd, env))
        proc = subprocess.Popen(cmd, env=env)
        stop_watch = threading.Event()

        def watch():
            # The driver's verdict (too few slots past the timeout, the reset
            # limit, every host blacklisted) ends the job.
            while not stop_watch.wait(0.5):
                if abort is not None and abort():
                    run_job.stop(proc)
                    return

        watcher = threading.Thread(target=watch, name="hvdcompat-run-abort", daemon=True)
        watcher.start()
        try:
            codes.append(run_job.collect(proc, job, job.num_proc, timeout, elastic=True))
            job.drain()
        finally:
            stop_watch.set()
            run_job.stop(proc)
        return 1 if codes[-1] is None else codes[-1]

    options.verbose = bool(verbose)  # the driver prints the mpirun line
    MpiElasticDriver.launch(options, plan, launch_ranks)
    return codes[-1] if codes else None


def final_reports(results, failures, num_proc, hosts_of, lost, problems, code):
    """The final world's result reports, by its ranks (raises when it did not finish)."""
    places = {rank: report.get("final") for rank, report in results.items()}
    if results and all(p is None for p in places.values()) and len(results) == num_proc:
        places = {rank: (rank, num_proc) for rank in results}  # no reset was ever needed
    sizes = {p[1] for p in places.values() if p is not None}
    final_ranks = sorted(p[0] for p in places.values() if p is not None)
    if len(sizes) == 1 and None not in places.values() and \
            final_ranks == list(range(sizes.pop())):
        by_final = {places[rank][0]: report for rank, report in results.items()}
        return [by_final[r] for r in range(len(by_final))]
    if failures:
        error, cause = run_job.failure_error(failures[0], failures, num_proc, hosts_of, results,
                                             lost, problems, code)
        raise error from cause
    described = ", ".join(f"rank {rank} as {p[0]} of {p[1]}" if p else f"rank {rank} (not in a "
                          "running job when it returned)" for rank, p in sorted(places.items()))
    raise HorovodInternalError(
        f"hvdcompat.run: the elastic job ended without a complete final world: "
        f"{len(results)} of {num_proc} started rank(s) returned ({described or 'none'}); the "
        "ranks' output is above.\n"
        + run_job.describe_missing(num_proc, hosts_of, results, lost, problems, code))
