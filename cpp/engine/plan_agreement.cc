#include "engine/plan_agreement.h"

#include <sstream>
#include <string>
#include <vector>

#include "core/logging.h"

namespace hvdcompat {
namespace {

// How the user sets `knob`: HOROVOD_<suffix> where Horovod has it, else HVDCOMPAT_<suffix>.
std::string VariableOf(Knob knob) {
  const KnobSpec& spec = SpecOf(knob);
  return std::string(spec.horovod_alias ? "HOROVOD_" : "HVDCOMPAT_") + spec.suffix;
}

std::string Text(int64_t v) { return std::to_string(v); }
std::string Text(bool v) { return v ? "1" : "0"; }
std::string Text(const std::string& v) { return v; }

// A value as the user sets it (GPU_OPERATIONS is a bool inside: through host memory or not).
std::string Shown(Knob knob, const std::string& text) {
  if (knob != Knob::kGpuOperations) return text;
  return text == "1" ? "MPI/GLOO" : "NCCL";
}

void Parse(const std::string& s, int64_t* v) { *v = std::stoll(s); }
void Parse(const std::string& s, bool* v) { *v = s == "1"; }
void Parse(const std::string& s, std::string* v) { *v = s; }

// Calls f(knob, field) for every plan knob of `c` (Note [Plan knobs from set rank 0]).
// hierarchical_allreduce_set goes with HIERARCHICAL_ALLREDUCE: whether it was given
// decides between it and the link plan.
template <typename C, typename F>
void ForEachPlanKnob(C& c, F&& f) {
  f(Knob::kFusionThreshold, c.fusion_threshold_bytes);
  f(Knob::kCacheCapacity, c.cache_capacity);
  f(Knob::kFusionChunkBytes, c.fusion_chunk_bytes);
  f(Knob::kInPlaceMinBytes, c.inplace_min_bytes);
  f(Knob::kMaxCallBytes, c.max_call_bytes);
  f(Knob::kHierarchicalAllreduce, c.hierarchical_allreduce);
  f(Knob::kHierarchicalAllreduce, c.hierarchical_allreduce_set);
  f(Knob::kHierarchicalAllgather, c.hierarchical_allgather);
  f(Knob::kHierarchicalLocalSize, c.hierarchical_local_size);
  f(Knob::kLinkPlan, c.link_plan);
  f(Knob::kNetworkSegmentBytes, c.network_segment_bytes);
  f(Knob::kNetworkPipelineDepth, c.network_pipeline_depth);
  f(Knob::kNetwork16BitWire, c.network_16bit_wire);
  f(Knob::kGlooSegmentBytes, c.gloo_segment_bytes);
  f(Knob::kGlooPipelineDepth, c.gloo_pipeline_depth);
  f(Knob::kGlooExchangeMaxBytes, c.gloo_exchange_max_bytes);
  f(Knob::kNumNcclStreams, c.num_nccl_streams);
  f(Knob::kGpuOperations, c.gpu_operations_mpi);
}

// The plan knobs' values, one per line, in ForEachPlanKnob's order (the same on every
// rank: one build).
std::vector<std::string> PlanValues(const Config& config) {
  std::vector<std::string> values;
  ForEachPlanKnob(config, [&](Knob, const auto& field) { values.push_back(Text(field)); });
  return values;
}

}  // namespace

void CopyPlanKnobs(const Config& from, Config* to) {
  const std::vector<std::string> values = PlanValues(from);
  size_t i = 0;
  ForEachPlanKnob(*to, [&](Knob, auto& field) { Parse(values[i++], &field); });
}

void AgreeOnPlanKnobs(ControlTransport* transport, Config* config, int set_id,
                      const std::vector<int>& global_ranks) {
  const std::vector<std::string> mine = PlanValues(*config);
  std::string blob;
  for (const auto& v : mine) blob += v + '\n';
  transport->BroadcastBlob(&blob);
  std::vector<std::string> root;
  std::istringstream in(blob);
  for (std::string line; std::getline(in, line);) root.push_back(line);
  if (root == mine) return;
  std::ostringstream differ;
  size_t i = 0;
  bool first = true;
  ForEachPlanKnob(*config, [&](Knob knob, auto& field) {
    const std::string& theirs = root[i];
    if (theirs != mine[i++]) {
      if (static_cast<const void*>(&field) != &config->hierarchical_allreduce_set) {
        differ << (first ? "" : ", ") << VariableOf(knob) << '=' << Shown(knob, Text(field))
               << " (rank 0: " << Shown(knob, theirs) << ')';
        first = false;
      }
      Parse(theirs, &field);
    }
  });
  HVD_LOG(kWarning)
      << "process set " << set_id << ", rank " << global_ranks[transport->rank()] << ": "
      << (first ? std::string("HOROVOD_HIERARCHICAL_ALLREDUCE, set here and not on rank 0 "
                              "or the other way round,")
                : differ.str())
      << " differ from the set's rank 0 (global rank " << global_ranks[0]
      << "); every rank of the set uses rank 0's values, since ranks that fuse, split or "
      << "route collectives differently would wait on each other forever. Set them alike on "
      << "every rank (hvdcompatrun and mpirun -x forward them; under torchrun, export them on "
      << "every node)";
}

}  // namespace hvdcompat
