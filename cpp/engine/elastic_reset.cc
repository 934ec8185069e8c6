#include "engine/elastic_reset.h"

#if defined(OPEN_MPI)
#include <mpi-ext.h>  // ULFM (MPIX_*); the MPICH family has no such header
#endif

#include <algorithm>
#include <map>

#include "core/logging.h"
#include "transport/mpi_util.h"

namespace hvdcompat {

namespace {

#if defined(OMPI_HAVE_MPI_EXT_FTMPI) && OMPI_HAVE_MPI_EXT_FTMPI
constexpr bool kUlfmBuilt = true;
#else
constexpr bool kUlfmBuilt = false;
#endif

// The old world's rank of each member of `shrunk`, in `shrunk`'s order.
std::vector<int> OldRanks(MPI_Comm old_world, MPI_Comm shrunk) {
  int n = 0;
  HVD_MPI_CHECK(shrunk, MPI_Comm_size(shrunk, &n));
  MPI_Group old_group, new_group;
  HVD_MPI_CHECK(old_world, MPI_Comm_group(old_world, &old_group));
  HVD_MPI_CHECK(shrunk, MPI_Comm_group(shrunk, &new_group));
  std::vector<int> in(n), out(n);
  for (int i = 0; i < n; ++i) in[i] = i;
  int rc = MPI_Group_translate_ranks(new_group, n, in.data(), old_group, out.data());
  MPI_Group_free(&new_group);
  MPI_Group_free(&old_group);
  HVD_MPI_CHECK(shrunk, rc);
  return out;
}

MPI_Comm Shrink(MPI_Comm world) {
  MPI_Comm shrunk = MPI_COMM_NULL;
#if defined(OMPI_HAVE_MPI_EXT_FTMPI) && OMPI_HAVE_MPI_EXT_FTMPI
  // Revoked first, so a survivor still blocked in a call on the old world
  // (a process set registration, say) returns instead of waiting forever.
  if (FaultToleranceEnabled()) MPIX_Comm_revoke(world);
  HVD_MPI_CHECK(world, MPIX_Comm_shrink(world, &shrunk));
#else
  HVD_MPI_CHECK(world, MPI_Comm_dup(world, &shrunk));
#endif
  MPI_Comm_set_errhandler(shrunk, MPI_ERRORS_RETURN);
  return shrunk;
}

}  // namespace

bool FaultToleranceEnabled() {
  if (!kUlfmBuilt) return false;
#if defined(OMPI_HAVE_MPI_EXT_FTMPI) && OMPI_HAVE_MPI_EXT_FTMPI
  int* value = nullptr;
  int flag = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPIX_FT, &value, &flag) != MPI_SUCCESS) return false;
  return flag && value && *value;
#else
  return false;
#endif
}

void KeepSurvivingSets(const std::vector<std::pair<int, std::vector<int>>>& old_sets,
                       const std::vector<int>& survivors, InitOptions* options,
                       int world_size) {
  InitOptions& opts = *options;
  const size_t world = world_size < 0 ? survivors.size() : static_cast<size_t>(world_size);
  std::map<int, int> new_rank;  // old world rank -> new world rank
  for (size_t i = 0; i < survivors.size(); ++i) new_rank[survivors[i]] = static_cast<int>(i);
  for (const auto& [id, ranks] : old_sets) {
    std::vector<int> kept;
    for (int r : ranks) {
      auto it = new_rank.find(r);
      if (it != new_rank.end()) kept.push_back(it->second);
    }
    // A set that lost every member, or now equals another set or the whole
    // world, is dropped: a set must be distinct to be registered.
    bool duplicate = kept.size() == world ||
                     std::find(opts.process_sets.begin(), opts.process_sets.end(), kept) !=
                         opts.process_sets.end();
    if (kept.empty() || duplicate) {
      HVD_LOG(kWarning) << "elastic reset: process set " << id << " has "
                        << (kept.empty() ? "no surviving member" : "become a duplicate")
                        << " and is not registered again";
      continue;
    }
    opts.process_sets.push_back(kept);
    opts.process_set_ids.push_back(id);
  }
}

std::vector<std::pair<int, std::vector<int>>> RegisteredSets(const Runtime& rt) {
  std::vector<std::pair<int, std::vector<int>>> sets;
  for (int id : rt.ProcessSetIds()) {
    if (id == 0) continue;
    if (auto info = rt.GetProcessSet(id)) sets.emplace_back(id, info->ranks);
  }
  return sets;
}

namespace {

// Steps 2 (the survivors' ranks) and 3 of Note [Elastic reset] on the shrunk
// `out->world`: the sets' surviving members, then the new runtime.
void BuildOnSurvivors(MPI_Comm old_world, const std::vector<std::pair<int, std::vector<int>>>& old_sets,
                      InitOptions* options, ResetResult* out) {
  ResetResult& result = *out;
  result.survivors = OldRanks(old_world, result.world);
  KeepSurvivingSets(old_sets, result.survivors, options);
  options->comm = result.world;
  result.runtime = std::make_shared<Runtime>(*options);  // step 3
}

}  // namespace

ResetResult RebuildFromSurvivors(const std::shared_ptr<Runtime>& old) {
  const MPI_Comm old_world = old->mpi().comm();
  const int old_rank = old->mpi().rank();
  const int old_size = old->mpi().size();
  InitOptions opts;
  opts.dynamic_process_sets = old->dynamic_process_sets();
  opts.continue_timeline = true;
  const auto old_sets = RegisteredSets(*old);
  // Step 1. Device communicators first: ncclCommDestroy (and draining work
  // queued on them) may wait forever on a dead peer, ncclCommAbort does not;
  // the new runtime makes new ones, with a new unique id, at its first GPU
  // collective.
  old->Abandon("the job is being rebuilt from the surviving ranks (elastic reset)");
  old->Stop();

  ResetResult result;
  // Without ULFM enabled no rank can be lost without the launcher ending the
  // job, so the shrink keeps every rank (it is then a dup).
  result.world = Shrink(old_world);  // step 2
  try {
    BuildOnSurvivors(old_world, old_sets, &opts, &result);
  } catch (...) {
    // Nothing uses the survivors' communicator yet: free it with the failure.
    MPI_Comm_free(&result.world);
    throw;
  }
  HVD_LOG(kInfo) << "elastic reset: old rank " << old_rank << " of " << old_size << " is rank "
                 << result.runtime->mpi().rank() << " of " << result.runtime->mpi().size();
  return result;
}

}  // namespace hvdcompat
