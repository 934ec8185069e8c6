"""hvdcompatrun, the launcher (``python -m hvdcompat.runner.launch`` or ``hvdcompatrun``)."""

__all__ = ["main"]


def main(argv=None):
    """Runs hvdcompatrun with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    from hvdcompat.runner.launch import main as _main

    return _main(argv)
