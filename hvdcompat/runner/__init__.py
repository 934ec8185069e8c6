"""The launchers, laid out as Horovod's ``horovod.runner``.

- ``hvdcompatrun`` (``python -m hvdcompat.runner.launch``): :mod:`.launch` parses the command
  line, :mod:`.mpirun_command` builds the mpirun line, :mod:`.gloo_run` starts ranks without
  MPI, :mod:`.rank_supervisor` wraps every rank, :mod:`.exit_report` turns their exits into
  the summary, :mod:`.elastic.driver` is the elastic driver.
- ``hvdcompat.run`` (Horovod's ``horovod.run``, :func:`run` here): :mod:`.run_func` (the
  parameters and the plain launch), :mod:`.elastic.run_func` (the elastic launch),
  :mod:`.run_job` (the mpirun line, the ranks' reports and the errors they become),
  :mod:`.run_task` (a rank's side), :mod:`.common.channel` (the authenticated channel between
  them).
"""

__all__ = ["main", "run", "RankFailedError"]


def main(argv=None):
    """Runs hvdcompatrun with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    from hvdcompat.runner.launch import main as _main

    return _main(argv)


def __getattr__(name):
    # hvdcompat.runner is imported by the library's lowest modules (for mpi_world); loading
    # hvd.run's launcher only when it is asked for keeps that import light.
    if name in ("run", "RankFailedError"):
        from hvdcompat.runner import run_func

        return getattr(run_func, name)
    raise AttributeError(f"module 'hvdcompat.runner' has no attribute {name!r}")
