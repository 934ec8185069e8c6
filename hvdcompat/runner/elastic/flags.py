"""hvdcompatrun's elastic flags (Horovod's names and meaning) and their checks.

Any of them makes a launch elastic: on MPI a fault-tolerant launch under the
driver of hvdcompat/runner/elastic/mpi_driver.py, with ``--gloo`` the driver
of hvdcompat/runner/elastic/gloo_driver.py.
"""

__all__ = ["DEFAULT_ELASTIC_TIMEOUT", "add_elastic_arguments", "elastic_requested",
           "check_elastic_args"]

DEFAULT_ELASTIC_TIMEOUT = 600


def add_elastic_arguments(parser):
    """Adds Horovod's elastic flags to hvdcompatrun's parser."""
    g = parser.add_argument_group(
        "elastic training (hvd.elastic; on MPI implies --fault-tolerant)")
    g.add_argument("--min-np", type=int, metavar="N",
                   help="fewest ranks to start with and to continue with after a failure")
    g.add_argument("--max-np", type=int, metavar="N",
                   help="most ranks the job grows to when hosts are added")
    g.add_argument("--slots-per-host", type=int, metavar="N",
                   help="slots of a discovered host that lists none (default 1)")
    g.add_argument("--host-discovery-script", metavar="SCRIPT",
                   help="executable printing the available hosts, one 'host[:slots]' per line; "
                        "run every second: hosts that disappear leave the job at the next "
                        "commit, hosts that appear join it then (on MPI the job restarts from "
                        "that commit; with --gloo the running workers stay and new ones join)")
    g.add_argument("--elastic-timeout", type=int, metavar="SECONDS",
                   help="how long to wait for --min-np slots, at the start and whenever "
                        f"fewer are usable (default {DEFAULT_ELASTIC_TIMEOUT})")
    g.add_argument("--reset-limit", type=int, metavar="N",
                   help="stop with an error after this many resets")
    g.add_argument("--blacklist-cooldown-range", type=int, nargs=2, metavar=("MIN", "MAX"),
                   help="a host whose ranks failed is blacklisted for a random MIN..MAX "
                        "seconds, then rejoins if discovery lists it (default: for good)")


def elastic_requested(args):
    """Whether any elastic flag was given."""
    return any(getattr(args, a) is not None for a in (
        "min_np", "max_np", "slots_per_host", "host_discovery_script", "elastic_timeout",
        "reset_limit", "blacklist_cooldown_range"))


def check_elastic_args(args, np):
    """Checks the elastic flags against each other and ``-np``.

    Raises:
        ValueError: naming the flag and what to change.
    """
    for name in ("min_np", "max_np", "slots_per_host", "reset_limit"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "reset_limit" else 1):
            raise ValueError(f"hvdcompatrun: --{name.replace('_', '-')} must be at least "
                             f"{0 if name == 'reset_limit' else 1}, got {value}")
    if args.elastic_timeout is not None and args.elastic_timeout < 0:
        raise ValueError(f"hvdcompatrun: --elastic-timeout must be >= 0, got "
                         f"{args.elastic_timeout}")
    if args.min_np is not None and args.max_np is not None and args.min_np > args.max_np:
        raise ValueError(f"hvdcompatrun: --min-np {args.min_np} is above --max-np {args.max_np}")
    if np is not None and args.min_np is not None and np < args.min_np:
        raise ValueError(f"hvdcompatrun: -np {np} is below --min-np {args.min_np}")
    if np is not None and args.max_np is not None and np > args.max_np:
        raise ValueError(f"hvdcompatrun: -np {np} is above --max-np {args.max_np}")
    if args.blacklist_cooldown_range is not None:
        low, high = args.blacklist_cooldown_range
        if low < 0 or high < low:
            raise ValueError("hvdcompatrun: --blacklist-cooldown-range MIN MAX needs "
                             f"0 <= MIN <= MAX, got {low} {high}")
    if args.host_discovery_script is not None and (args.hosts or args.hostfile):
        raise ValueError("hvdcompatrun: --host-discovery-script replaces -H/--hostfile; "
                         "give one of them")
