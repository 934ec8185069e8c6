// Which ranks of a process set form a node, and whether the hierarchical
// host collectives apply (Note [Hierarchical host collectives],
// ops/mpi_hierarchical_ops.h). Shared by the MPI and Gloo backends; pure
// functions, callable from any thread.
#pragma once

#include <string>
#include <vector>

#include "core/env.h"

namespace hvdcompat {

// This rank's node and cross groups in a process set (indices are set ranks).
struct NodeGroups {
  std::vector<int> local;  // the ranks of this rank's node, ascending
  std::vector<int> cross;  // the ranks with this rank's index in their node, ascending
  int local_rank = 0;      // this rank's index in `local`
  int cross_rank = 0;      // ... in `cross`
  int min_local = 1;       // the fewest ranks any node has
  int max_local = 1;       // the most
  bool consecutive = true;  // node c holds ranks c * L .. c * L + L - 1 (L ranks on every node)
};

// The groups of `rank` when rank r runs on node `nodes[r]` (any label: a
// host name). Nodes are numbered in the order their first rank appears.
NodeGroups GroupByNode(const std::vector<std::string>& nodes, int rank);

// The node label of every rank of a set for the Gloo controller: its host
// name (`hosts`, indexed by global rank), or with
// HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE=K, r / K for set rank r.
std::vector<std::string> NodeLabels(const std::vector<int>& global_ranks,
                                    const std::vector<std::string>& hosts, int64_t per_node);

struct HierarchyChoice {
  bool allreduce = false;
  bool allgather = false;
};

// Whether the knobs' hierarchical allreduce/allgather run on this layout:
// several nodes of several ranks each, the same number on every node, and
// for the allgather nodes of consecutive ranks. `log` (set rank 0) says at
// info level why a knob that is set is not followed.
HierarchyChoice ChooseHierarchy(const Config& config, int local_size, int cross_size,
                                int min_local, int max_local, bool consecutive, bool log);

}  // namespace hvdcompat
