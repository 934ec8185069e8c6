"""A short elastic training that loses a rank, then ends in a chosen way (for the exit tests).

    hvdcompatrun -np 3 --min-np 2 python tests/scripts/elastic_exit.py LOSE END

World rank LOSE (-1: none) raises inside hvd.elastic.run at step 2 of 4, so
it leaves the job and the others reset and finish. Then every rank still in
the job ends by END: ``exit:N`` (``sys.exit(N)``), ``raise`` (an unhandled
exception) or ``return`` (the script's end). Each survivor prints one line
with its world rank and new place first.
"""

import sys

import torch

import hvdcompat as hvd

lose, end = int(sys.argv[1]), sys.argv[2]
hvd.init()
first = hvd.rank()
state = hvd.elastic.TorchState(step=0, total=0.0)


@hvd.elastic.run
def train(state):
    while state.step < 4:
        if first == lose and state.step == 2:
            raise RuntimeError(f"injected failure on rank {first} at step {state.step}")
        state.total += hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum,
                                     name=f"step.{state.step}").item()
        state.step += 1
        state.commit()


train(state)
print(f"SURVIVOR world rank {first} is rank {hvd.rank()} of {hvd.size()}, total {state.total}, "
      f"ending by {end}", flush=True)
if end.startswith("exit:"):
    sys.exit(int(end.split(":", 1)[1]))
if end == "raise":
    raise ValueError(f"unhandled error on world rank {first}")
