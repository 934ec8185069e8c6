// Agreement on the knobs that shape a process set's collectives: every rank
// of a set takes set rank 0's values. See Note [Plan knobs from set rank 0].
//
// Thread: called from the set worker's constructor, before its thread
// exists; collective over the set's transport.
#pragma once

#include <string>
#include <vector>

#include "core/env.h"
#include "transport/control_transport.h"

namespace hvdcompat {

// Note [Plan knobs from set rank 0]
// Some knobs decide which calls a set's ranks make together and what they
// carry: fusion (which tensors share a call), the response cache's capacity
// (the caches must evolve alike, Note [Cycle words]), the pipeline chunk and
// the largest call, the hierarchical steps, the link plan and its segments,
// the 16-bit wire, Gloo's ring segments and exchange size, the GPU path.
// Each rank reads them from its own environment, so ranks launched with
// different ones (torchrun nodes whose environments differ, a knob exported
// on one host only) would make different calls and wait forever, or reduce
// different element sizes. When a set's worker starts, set rank 0 broadcasts
// its values and every rank takes them; a rank whose own values differ
// warns, naming each variable with its value and rank 0's. Horovod settles
// fusion the same way (its coordinator, rank 0, fuses). The runtime keeps
// the global set's agreed values for the sets it registers later, so those
// agree without a warning even when their rank 0 is another rank.

// Replaces this rank's plan knobs in `config` with set rank 0's (collective
// over `transport`) and warns when they differed; `global_ranks` are the set's
// members, `set_id` names the set in the warning.
void AgreeOnPlanKnobs(ControlTransport* transport, Config* config, int set_id,
                      const std::vector<int>& global_ranks);

// Copies the plan knobs (only those) from `from` into `to`.
void CopyPlanKnobs(const Config& from, Config* to);

}  // namespace hvdcompat
