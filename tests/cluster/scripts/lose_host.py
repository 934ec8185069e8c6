"""Training while a host is lost; survivors report what they saw and when.

Environment:
    DRILL: "exit" (the lost host's ranks exit with status 7), "kill" (they
        die of SIGKILL) or "cut" (the driver takes the host's link down once
        $DRILL_OUT/ready-<rank> files exist for every rank).
    DRILL_HOSTNAME: the host whose ranks are lost.
    DRILL_OUT: directory for the reports (the launcher may stop forwarding
        output once the job has lost a process).
    DRILL_SURVIVORS: how many survivors (ranks off DRILL_HOSTNAME) report;
        each waits (up to 30 s) for the others' reports before it exits.
    DRILL_BUSY: seconds the lost host's ranks first spend away from
        collectives (alive, busy) while the others wait in one; they must not
        be taken for lost (default 0: no such phase).

Each rank writes $DRILL_OUT/ready-<rank> once it trained; a lost rank writes
$DRILL_OUT/lost (wall-clock time) just before it dies. Survivors write
``SURVIVOR <rank> <wall time> <ExceptionType>: <message>`` and an ``AFTER``
line (a later op fails too) to $DRILL_OUT/<rank>. The ranks of a cut host go
on too, cut off, and see the others lost: they write the same lines to
$DRILL_OUT/far-<rank> and exit without waiting. (The test hosts share one
file system, which real hosts would not: were their reports counted, a
survivor could stop waiting and exit while another survivor was still
finding out what was lost, and be reported lost itself.)
"""

import os
import signal
import socket
import sys
import time

import torch

import hvdcompat as hvd

hvd.init()
rank = hvd.rank()
out_dir = os.environ["DRILL_OUT"]
drill = os.environ["DRILL"]
victim = socket.gethostname() == os.environ["DRILL_HOSTNAME"]
model = torch.nn.Linear(64, 16)
for step in range(5):
    for name, p in model.named_parameters():
        hvd.allreduce_(p.data, name=f"w.{name}")
busy = float(os.environ.get("DRILL_BUSY", "0"))
if busy:
    started = time.monotonic()
    if victim:
        time.sleep(busy)
    hvd.allreduce(torch.ones(1), name="after.busy")  # raises if a busy rank was taken for lost
    print(f"rank {rank} waited {time.monotonic() - started:.1f} s on a busy host", flush=True)
open(os.path.join(out_dir, f"ready-{rank}"), "w").close()
print(f"rank {rank} on {socket.gethostname()} trained", flush=True)
if victim and drill in ("exit", "kill"):
    # Every rank is past its first steps; the others are inside the next allreduces.
    hvd.allreduce(torch.ones(1), name="all.ready")
    time.sleep(0.5)
    with open(os.path.join(out_dir, f"lost-{rank}"), "w") as f:
        f.write(f"{time.time():.3f}\n")
    if drill == "exit":
        os._exit(7)
    os.kill(os.getpid(), signal.SIGKILL)
if drill in ("exit", "kill"):
    hvd.allreduce(torch.ones(1), name="all.ready")
out = open(os.path.join(out_dir, f"far-{rank}" if victim else str(rank)), "w", buffering=1)
start = time.monotonic()
try:
    while time.monotonic() - start < 150:
        for name, p in model.named_parameters():
            hvd.allreduce_(p.data, name=f"w.{name}")
    out.write(f"SURVIVOR {rank} no error after 150 s\n")
except Exception as e:  # noqa: BLE001 - reporting what arrived
    out.write(f"SURVIVOR {rank} {time.time():.3f} {type(e).__name__}: {e}\n")
    try:
        hvd.allreduce(torch.ones(1), name="after")
        out.write(f"AFTER {rank} no error\n")
    except hvd.HorovodInternalError as e2:
        out.write(f"AFTER {rank} {type(e2).__name__}\n")
out.close()
# A survivor that exits is a failed process to the others (no MPI_Finalize under
# ULFM): wait (bounded) until every survivor has reported, so that none of them
# is told of a survivor's exit in place of the lost host.
survivors = 0 if victim else int(os.environ.get("DRILL_SURVIVORS", "0"))
deadline = time.monotonic() + 30


def _reported():
    names = [n for n in os.listdir(out_dir) if n.isdigit()]
    return sum("AFTER" in open(os.path.join(out_dir, n)).read() for n in names)


while _reported() < survivors and time.monotonic() < deadline:
    time.sleep(0.1)
sys.stdout.flush()
os._exit(0)
