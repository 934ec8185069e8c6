"""Each rank prints one ENV line: its rank, topology, hostname and chosen variables as JSON."""

import json
import os
import socket

import torch

import hvdcompat as hvd

NAMES = ["OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "MY_OWN_SETTING", "HOROVOD_CYCLE_TIME",
         "HOSTNAME", "DISPLAY", "SSH_AUTH_SOCK", "TERM", "NCCL_SOCKET_IFNAME", "PWD",
         "HVDCOMPAT_REPORT_TOKEN"]

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="ranks").item()
print("ENV " + json.dumps({
    "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
    "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
    "cross_size": hvd.cross_size(), "homogeneous": hvd.is_homogeneous(), "sum": total,
    "host": socket.gethostname(), "cwd": os.getcwd(),
    "env": {n: os.environ.get(n) for n in NAMES}}), flush=True)
hvd.shutdown()
