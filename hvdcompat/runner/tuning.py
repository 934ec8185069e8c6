"""hvdcompatrun's tuning flags and the environment knobs they set.

The knobs themselves (names, Horovod aliases, defaults, meaning) are declared
once, in the core (``hvdcompat._core.knobs()``); this module only maps
horovodrun-style flags onto them and renders the table of docs/environment.md:

    python -m hvdcompat.runner.tuning      # prints docs/environment.md's table
"""

from dataclasses import dataclass
from typing import Callable, Optional

__all__ = ["TuningFlag", "TUNING_FLAGS", "knobs", "knob", "add_tuning_arguments",
           "tuning_environment", "markdown_table"]

LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")


@dataclass(frozen=True)
class TuningFlag:
    """One command-line flag that sets one knob.

    Attributes:
        flags: option strings (first one is the documented name).
        suffix: the knob's name without ``HVDCOMPAT_`` / ``HOROVOD_``.
        type: argparse type, or None for a switch that sets the knob to 1.
        to_env: turns the parsed value into the variable's string.
        metavar: shown in --help.
        choices: allowed values, if any.
        note: added to the help text (e.g. a unit that differs from the knob's).
    """

    flags: tuple
    suffix: str
    type: Optional[Callable] = None
    to_env: Callable = str
    metavar: Optional[str] = None
    choices: Optional[tuple] = None
    note: str = ""

    @property
    def dest(self):
        return "tune_" + self.suffix.lower()


def _mb_to_bytes(mb):
    return str(int(round(mb * 1024 * 1024)))


def _number(v):
    return f"{v:g}"


def _level(v):
    return v.lower()


# horovodrun's flag names, so existing launch scripts keep working.
TUNING_FLAGS = (
    TuningFlag(("--fusion-threshold-mb",), "FUSION_THRESHOLD", float, _mb_to_bytes, "MB",
               note="Given in MiB here, stored in bytes."),
    TuningFlag(("--cycle-time-ms",), "CYCLE_TIME", float, _number, "MS"),
    TuningFlag(("--cache-capacity",), "CACHE_CAPACITY", int, str, "N"),
    TuningFlag(("--hierarchical-allreduce",), "HIERARCHICAL_ALLREDUCE"),
    TuningFlag(("--hierarchical-allgather",), "HIERARCHICAL_ALLGATHER"),
    TuningFlag(("--num-nccl-streams",), "NUM_NCCL_STREAMS", int, str, "N"),
    TuningFlag(("--timeline-filename",), "TIMELINE", str, str, "FILE"),
    TuningFlag(("--timeline-mark-cycles",), "TIMELINE_MARK_CYCLES"),
    TuningFlag(("--no-stall-check",), "STALL_CHECK_DISABLE"),
    TuningFlag(("--stall-check-warning-time-seconds",), "STALL_CHECK_TIME_SECONDS", float,
               _number, "S"),
    TuningFlag(("--stall-check-shutdown-time-seconds",), "STALL_SHUTDOWN_TIME_SECONDS", float,
               _number, "S"),
    TuningFlag(("--log-level",), "LOG_LEVEL", _level, str, "LEVEL", LOG_LEVELS),
    # horovodrun renamed --log-hide-timestamp to --log-without-timestamp; both work.
    TuningFlag(("--log-without-timestamp", "--log-hide-timestamp"), "LOG_HIDE_TIME"),
    TuningFlag(("--autotune",), "AUTOTUNE"),
    TuningFlag(("--autotune-log-file",), "AUTOTUNE_LOG", str, str, "FILE"),
    TuningFlag(("--autotune-warmup-samples",), "AUTOTUNE_WARMUP_SAMPLES", int, str, "N"),
    TuningFlag(("--autotune-steps-per-sample",), "AUTOTUNE_STEPS_PER_SAMPLE", int, str, "N"),
    TuningFlag(("--autotune-bayes-opt-max-samples",), "AUTOTUNE_BAYES_OPT_MAX_SAMPLES", int, str,
               "N"),
    TuningFlag(("--autotune-gaussian-process-noise",), "AUTOTUNE_GAUSSIAN_PROCESS_NOISE", float,
               _number, "NOISE"),
)


def knobs():
    """The core's knob list: dicts with name, horovod_name, default, unit, help."""
    from hvdcompat.basics import _core

    return list(_core.knobs())


def knob(suffix):
    """The core's declaration of ``HVDCOMPAT_<suffix>``; KeyError if it has none."""
    for k in knobs():
        if k["name"] == "HVDCOMPAT_" + suffix:
            return k
    raise KeyError(f"the core declares no knob HVDCOMPAT_{suffix}")


def _default_text(k):
    default, unit = k["default"], k["unit"]
    if default == "":
        return "unset"
    if unit == "bool":
        return "off" if default.lower() in ("0", "false", "no", "off") else "on"
    if "|" in unit:
        return f"{default} (one of {unit.replace('|', ', ')})"
    try:
        value = float(default)
    except ValueError:
        return default
    if unit == "bytes" and value >= 1 << 20:
        return f"{default} bytes ({value / (1 << 20):g} MiB)"
    return f"{default} {unit}"


def add_tuning_arguments(parser):
    """Adds every :data:`TUNING_FLAGS` entry to ``parser`` as its own group."""
    group = parser.add_argument_group(
        "tuning (each flag sets an environment variable for every rank; "
        "HVDCOMPAT_* wins over HOROVOD_*)")
    for tf in TUNING_FLAGS:
        k = knob(tf.suffix)
        help_text = f"{k['help']} {tf.note} Sets {k['name']} (default: {_default_text(k)})."
        help_text = help_text.replace("  ", " ")
        help_text = help_text.replace("%", "%%")
        if tf.type is None:
            group.add_argument(*tf.flags, dest=tf.dest, action="store_true", help=help_text)
        else:
            group.add_argument(*tf.flags, dest=tf.dest, type=tf.type, metavar=tf.metavar,
                               choices=tf.choices, help=help_text)


def tuning_environment(args):
    """``{HVDCOMPAT_NAME: value}`` for the tuning flags given on the command line."""
    env = {}
    for tf in TUNING_FLAGS:
        value = getattr(args, tf.dest, None)
        if value is None or value is False:
            continue
        env["HVDCOMPAT_" + tf.suffix] = "1" if value is True else tf.to_env(value)
    return env


def markdown_table():
    """The environment-variable table of docs/environment.md, generated from the core's knobs."""
    flag_of = {tf.suffix: tf.flags[0] for tf in TUNING_FLAGS}
    rows = ["| variable | Horovod spelling | default | hvdcompatrun flag | meaning |",
            "|---|---|---|---|---|"]
    for k in knobs():
        suffix = k["name"][len("HVDCOMPAT_"):]
        horovod = f"`{k['horovod_name']}`" if k["horovod_name"] else "—"
        flag = f"`{flag_of[suffix]}`" if suffix in flag_of else "—"
        default = _default_text(k)
        rows.append(f"| `{k['name']}` | {horovod} | {default} | {flag} | "
                    f"{k['help'].replace('|', '/')} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
