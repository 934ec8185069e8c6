"""Plots docs/scaling.png from the JSON of negotiation_scaling.py and scaling_benchmark.py.

    python scripts/negotiation_scaling.py --sizes 2,8,32,64,256,1024 --json sim.json
    python scripts/scaling_benchmark.py --json measured.json          # root, test hosts
    python scripts/plot_scaling.py --sim sim.json --measured measured.json --out docs/scaling.png

Needs matplotlib (``pip install matplotlib``); without it, says so and exits 2.
"""

import argparse
import json
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sim", required=True)
    parser.add_argument("--measured")
    parser.add_argument("--out", default="docs/scaling.png")
    args = parser.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_scaling: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 2
    with open(args.sim, encoding="utf-8") as f:
        sim = json.load(f)
    measured = []
    if args.measured:
        with open(args.measured, encoding="utf-8") as f:
            measured = json.load(f)
    panels = 3 if measured else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    ranks = [r["ranks"] for r in sim]

    ax = axes[0]
    ax.plot(ranks, [r["footprint"]["decode_add_ns"] / 1e6 + r["footprint"]["decide_encode_ns"] / 1e6
                    for r in sim], "o-", label="coordinator CPU (alone)")
    ax.plot(ranks, [r["first"]["root_engine_cpu_ns"] / 1e6 for r in sim], "s--",
            label="set rank 0 engine CPU (threads)")
    if measured:
        ax.plot([m["ranks"] for m in measured], [m["first"]["coordinator_ns"] / 1e6 for m in measured],
                "^-", label="coordinator, measured (test hosts)")
    ax.axhline(100, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks")
    ax.set_ylabel("ms")
    ax.set_title("First iteration, 161 new names")
    ax.legend(fontsize=8)

    ax = axes[1]
    ax.plot(ranks, [r["steady"]["root_engine_cpu_ns"] / 1e3 for r in sim], "o-", label="set rank 0")
    ax.plot(ranks, [r["steady"]["mean_other_engine_cpu_ns"] / 1e3 for r in sim], "s--",
            label="other ranks, mean")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("ranks")
    ax.set_ylabel("engine CPU per iteration, us")
    ax.set_title("Steady state (simulated), 161 cached names")
    ax.legend(fontsize=8)

    if measured:
        ax = axes[2]
        mr = [m["ranks"] for m in measured]
        ax.plot(mr, [m["hvd_4k_us"] / m["mpi_4k_us"] for m in measured], "o-",
                label="4 KiB allreduce / raw MPI")
        ax.plot(mr, [m["cycle_us"] / m["mpi_40b_us"] for m in measured], "s--",
                label="negotiation cycle / raw MPI 40 B")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("ranks (4 test hosts, 2 cores)")
        ax.set_ylabel("ratio")
        ax.set_title("Measured against raw MPI")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
