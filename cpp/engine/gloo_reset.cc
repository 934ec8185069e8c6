#include "engine/gloo_reset.h"

#include <algorithm>
#include <sstream>

#include "core/common.h"
#include "core/logging.h"
#include "engine/elastic_reset.h"

namespace hvdcompat {

namespace {

// Whether a survivor counted itself under `key` (adding 0 asks without a wait).
bool Has(KeyValueStore& kv, const std::string& key) { return kv.Add(key, 0) > 0; }

std::vector<int> ParseRanks(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(std::stoi(item));
  }
  return out;
}

std::string JoinComma(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// Step 2 of Note [Elastic reset on Gloo]: the old ranks of the new world.
std::vector<int> AgreeOnSurvivors(KeyValueStore& kv, const std::string& prefix, int old_rank,
                                  int old_size, const std::vector<int>& lost,
                                  std::chrono::milliseconds timeout) {
  kv.Add(prefix + "alive/" + std::to_string(old_rank), 1);
  if (kv.Add(prefix + "decider", 1) == 1) {
    std::vector<std::string> expected;
    for (int r = 0; r < old_size; ++r) {
      if (!std::binary_search(lost.begin(), lost.end(), r)) {
        expected.push_back(prefix + "alive/" + std::to_string(r));
      }
    }
    try {
      kv.Wait(expected, timeout);
    } catch (const std::exception&) {
      // Some rank the watch did not see lost is gone too: the world is who came.
    }
    std::vector<int> world;
    for (int r = 0; r < old_size; ++r) {
      if (Has(kv, prefix + "alive/" + std::to_string(r))) world.push_back(r);
    }
    kv.Set(prefix + "world", JoinComma(world));
  }
  const std::string key = prefix + "world";
  kv.Wait({key}, timeout * 3);
  return ParseRanks(kv.Get(key));
}

}  // namespace

GlooResetResult RebuildGlooFromSurvivors(const std::shared_ptr<Runtime>& old) {
  GlooJob& job = old->gloo();
  GlooOptions gloo = job.options();
  const int old_rank = old->job().rank;
  const int old_size = old->job().size;
  const std::vector<int> lost = job.watch().LostRanks();
  InitOptions opts;
  opts.controller = "gloo";
  opts.dynamic_process_sets = old->dynamic_process_sets();
  opts.continue_timeline = true;
  const auto old_sets = RegisteredSets(*old);
  // Step 1.
  old->Abandon("the job is being rebuilt from the surviving ranks (elastic reset)");
  old->Stop();

  gloo.generation += 1;
  const std::string prefix = "reset/" + std::to_string(gloo.generation) + "/";
  const auto timeout = job.timeout();
  GlooResetResult result;
  try {
    result.survivors = AgreeOnSurvivors(*gloo.store, prefix, old_rank, old_size, lost, timeout);
  } catch (const std::exception& e) {
    throw LibraryError("elastic reset on the Gloo controller (old rank " +
                       std::to_string(old_rank) + " of " + std::to_string(old_size) +
                       "): the survivors could not agree through the rendezvous store (" +
                       gloo.store->Describe() + "): " + e.what() +
                       ". The store must outlive every rank (hvdcompatrun --gloo serves it; "
                       "under torchrun the agent does; without either, rank 0 serves it and "
                       "must survive).");
  }
  const auto me = std::find(result.survivors.begin(), result.survivors.end(), old_rank);
  if (me == result.survivors.end()) {
    throw LibraryError("elastic reset on the Gloo controller: old rank " +
                       std::to_string(old_rank) + " reached the reset after the survivors (old "
                       "ranks " + JoinInts(result.survivors) + ") had agreed on the new world "
                       "without it (it came more than " + std::to_string(timeout.count() / 1000) +
                       " s late, HOROVOD_GLOO_TIMEOUT_SECONDS); this rank leaves the job.");
  }
  gloo.key_prefix = prefix;
  gloo.rank = static_cast<int>(me - result.survivors.begin());
  gloo.size = static_cast<int>(result.survivors.size());
  gloo.local_rank = gloo.local_size = gloo.cross_rank = gloo.cross_size = -1;
  opts.gloo = gloo;
  KeepSurvivingSets(old_sets, result.survivors, &opts);
  result.runtime = std::make_shared<Runtime>(opts);  // step 3
  HVD_LOG(kInfo) << "elastic reset on Gloo: old rank " << old_rank << " of " << old_size
                 << " is rank " << gloo.rank << " of " << gloo.size;
  return result;
}

}  // namespace hvdcompat
