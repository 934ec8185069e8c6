"""Writes a timeline while running; checks it parses mid-run; optionally dies abruptly."""

import json
import os
import sys

import torch

import hvdcompat as hvd

path = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else "normal"
hvd.init()
if mode == "dynamic":
    hvd.start_timeline(path, mark_cycles=True)
tensors = [torch.randn(1000 + i) for i in range(8)]
for step in range(5):
    handles = [hvd.allreduce_async_(t, name=f"grad.{i}") for i, t in enumerate(tensors)]
    for h in handles:
        hvd.synchronize(h)
    hvd.broadcast(torch.ones(3), root_rank=0, name="bcast")
hvd.barrier()
import time  # noqa: E402

time.sleep(0.4)  # at least one writer flush
if hvd.rank() == 0:
    with open(path) as f:
        events = json.load(f)  # readable while the job is still running
    print(f"MIDRUN {len(events)} events", flush=True)
if mode == "kill":
    os._exit(0)  # no shutdown, no flush at exit
if mode == "dynamic":
    hvd.stop_timeline()
hvd.shutdown()
