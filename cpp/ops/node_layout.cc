#include "ops/node_layout.h"

#include <algorithm>

#include "core/logging.h"

namespace hvdcompat {

NodeGroups GroupByNode(const std::vector<std::string>& nodes, int rank) {
  const int n = static_cast<int>(nodes.size());
  std::vector<int> node(n), index(n), node_size;
  std::vector<std::string> labels;
  for (int r = 0; r < n; ++r) {
    const auto it = std::find(labels.begin(), labels.end(), nodes[r]);
    node[r] = static_cast<int>(it - labels.begin());
    if (it == labels.end()) {
      labels.push_back(nodes[r]);
      node_size.push_back(0);
    }
    index[r] = node_size[node[r]]++;
  }
  NodeGroups g;
  for (int r = 0; r < n; ++r) {
    if (node[r] == node[rank]) {
      if (r == rank) g.local_rank = static_cast<int>(g.local.size());
      g.local.push_back(r);
    }
    if (index[r] == index[rank]) {
      if (r == rank) g.cross_rank = static_cast<int>(g.cross.size());
      g.cross.push_back(r);
    }
  }
  g.min_local = *std::min_element(node_size.begin(), node_size.end());
  g.max_local = *std::max_element(node_size.begin(), node_size.end());
  const int per_node = g.max_local;
  for (int r = 0; r < n; ++r) {
    g.consecutive = g.consecutive && r == node[r] * per_node + index[r];
  }
  g.consecutive = g.consecutive && g.min_local == g.max_local;
  return g;
}

std::vector<std::string> NodeLabels(const std::vector<int>& global_ranks,
                                    const std::vector<std::string>& hosts, int64_t per_node) {
  std::vector<std::string> labels(global_ranks.size());
  for (size_t r = 0; r < global_ranks.size(); ++r) {
    const int g = global_ranks[r];
    if (per_node > 0) {
      labels[r] = std::to_string(static_cast<int64_t>(r) / per_node);
    } else {
      // Unknown hosts: a node of its own (the hierarchy then does not apply).
      labels[r] = g >= 0 && g < static_cast<int>(hosts.size()) ? "host " + hosts[g]
                                                               : "rank " + std::to_string(g);
    }
  }
  return labels;
}

HierarchyChoice ChooseHierarchy(const Config& config, int local_size, int cross_size,
                                int min_local, int max_local, bool consecutive, bool log) {
  const bool homogeneous = min_local == max_local;
  const bool layered = local_size > 1 && cross_size > 1;
  HierarchyChoice c;
  c.allreduce = config.hierarchical_allreduce && homogeneous && layered;
  c.allgather = config.hierarchical_allgather && homogeneous && consecutive && layered;
  if (!log) return c;
  auto why = [&](bool wanted_consecutive) -> std::string {
    if (!homogeneous) {
      return "nodes run different numbers of ranks (" + std::to_string(min_local) + " to " +
             std::to_string(max_local) + ")";
    }
    if (!layered) return local_size == 1 ? "one rank per node" : "one node";
    if (wanted_consecutive && !consecutive) return "nodes are not made of consecutive ranks";
    return "";
  };
  if (config.hierarchical_allreduce && !c.allreduce) {
    HVD_LOG(kInfo) << "HOROVOD_HIERARCHICAL_ALLREDUCE: using the flat allreduce on host "
                      "tensors (" << why(false) << ")";
  }
  if (config.hierarchical_allgather && !c.allgather) {
    HVD_LOG(kInfo) << "HOROVOD_HIERARCHICAL_ALLGATHER: using the flat allgather ("
                   << why(true) << ")";
  }
  if (c.allreduce || c.allgather) {
    HVD_LOG(kDebug) << "hierarchical host collectives: " << cross_size << " nodes x "
                    << local_size << " ranks";
  }
  return c;
}

}  // namespace hvdcompat
