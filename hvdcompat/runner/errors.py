"""What the launcher and its elastic driver report before anything starts."""

__all__ = ["EXIT_USAGE", "LaunchError"]

# Launch problems found before anything starts (argparse also uses 2).
EXIT_USAGE = 2


class LaunchError(RuntimeError):
    """A problem found before launching; the message says what to do."""
