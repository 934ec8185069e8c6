"""One HOROVOD_TIMELINE across shutdown/init, unnamed ops, and a file that cannot be written.

argv[1]: the trace path. Phase 1 and 2 write it (a shutdown and init in
between); phase 3 points HOROVOD_TIMELINE at /dev/full. Rank 0 prints
"TRACE <json>" with what the test checks.
"""

import json
import os
import sys

import torch

import hvdcompat as hvd

path = sys.argv[1]


def run(phase, unnamed):
    for step in range(3):
        hvd.allreduce(torch.ones(4), name=f"{phase}.grad")
    for _ in range(unnamed):
        hvd.allreduce(torch.ones(2))
        hvd.allgather(torch.ones(1))


os.environ["HOROVOD_TIMELINE"] = path
hvd.init()
run("first", 40)
hvd.shutdown()
hvd.init()  # the same job: the trace goes on
run("second", 40)
hvd.shutdown()
os.environ["HOROVOD_TIMELINE"] = "/dev/full"
hvd.init()
run("third", 2)
hvd.shutdown()
os.environ["HOROVOD_TIMELINE"] = path
hvd.init()
if hvd.rank() == 0:
    with open(path) as f:
        events = json.load(f)
    rows = {}
    for e in events:
        if e["name"] == "thread_name":
            rows[(e["pid"], e["tid"])] = e["args"]["name"]
    spans = {}
    for e in events:
        if e["ph"] == "X":
            spans.setdefault(rows.get((e["pid"], e["tid"]), "?"), []).append(e["ts"])
    print("TRACE " + json.dumps({
        "rows": sorted(rows.values()),
        "row_ids": len(rows),
        "first_end": max(spans.get("allreduce.first.grad", [0])),
        "second_start": min(spans.get("allreduce.second.grad", [0])),
        "spans": {k: len(v) for k, v in spans.items()},
    }), flush=True)
hvd.shutdown()
