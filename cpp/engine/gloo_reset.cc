#include "engine/gloo_reset.h"

#include <algorithm>
#include <sstream>

#include "core/common.h"
#include "core/env.h"
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

// What step 2 of Note [Elastic reset on Gloo] decided.
struct WorldAgreement {
  std::vector<int> survivors;   // old ranks, ascending
  int joined = 0;               // new workers after them
  std::vector<int64_t> taken;   // the decider only: their "grow/<i>" indexes, in rank order
};

std::string GrowKey(int64_t index) { return "grow/" + std::to_string(index); }

// Step 2 of Note [Growing in place on Gloo]: the waiting workers counted
// since the last reset, in the order they came (decider only).
std::vector<int64_t> TakeWaitingWorkers(KeyValueStore& kv, std::chrono::milliseconds timeout) {
  const int64_t taken = kv.Add("grow/taken", 0);
  const int64_t counted = kv.Add("grow/count", 0);
  std::vector<int64_t> out;
  for (int64_t i = taken; i < counted; ++i) {
    try {
      kv.Wait({GrowKey(i)}, timeout);
      if (Has(kv, GrowKey(i) + "/gone")) continue;  // hvdcompatrun stopped it meanwhile
      out.push_back(i);
    } catch (const std::exception& e) {
      HVD_LOG(kWarning) << "elastic reset on Gloo: a worker counted itself as waiting to join ("
                        << GrowKey(i) << ") but never said who it is; it is left out ("
                        << e.what() << ")";
    }
  }
  if (counted > taken) kv.Add("grow/taken", counted - taken);
  return out;
}

// Step 2 of Note [Elastic reset on Gloo]: the old ranks of the new world, and
// the new workers that join it.
WorldAgreement AgreeOnWorld(KeyValueStore& kv, const std::string& prefix, int old_rank,
                            int old_size, const std::vector<int>& lost,
                            std::chrono::milliseconds timeout) {
  WorldAgreement out;
  kv.Add(prefix + "alive/" + std::to_string(old_rank), 1);
  kv.Add(prefix + "settled/" + std::to_string(old_rank), 1);
  if (kv.Add(prefix + "decider", 1) == 1) {
    std::vector<std::string> expected;
    for (int r = 0; r < old_size; ++r) {
      if (!std::binary_search(lost.begin(), lost.end(), r)) {
        expected.push_back(prefix + "settled/" + std::to_string(r));
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
    out.taken = TakeWaitingWorkers(kv, timeout);
    kv.Set(prefix + "world", JoinComma(world) + "|" + std::to_string(out.taken.size()));
  }
  const std::string key = prefix + "world";
  kv.Wait({key}, timeout * 3);
  const std::string value = kv.Get(key);
  const size_t bar = value.find('|');
  out.survivors = ParseRanks(value.substr(0, bar));
  out.joined = bar == std::string::npos ? 0 : std::stoi(value.substr(bar + 1));
  return out;
}

// What a new worker reads in "grow/<i>/world": "<generation> <rank> <size>
// <dynamic sets 0|1>", then one "<id>:<ranks>" line per process set.
std::string JoinAssignment(int generation, int rank, int size, const InitOptions& opts) {
  std::string s = std::to_string(generation) + " " + std::to_string(rank) + " " +
                  std::to_string(size) + " " + (opts.dynamic_process_sets ? "1" : "0") + "\n";
  for (size_t i = 0; i < opts.process_sets.size(); ++i) {
    s += std::to_string(opts.process_set_ids[i]) + ":" + JoinComma(opts.process_sets[i]) + "\n";
  }
  return s;
}

void ReadJoinAssignment(const std::string& text, InitOptions* opts) {
  std::istringstream in(text);
  int dynamic = 0;
  in >> opts->gloo.generation >> opts->gloo.rank >> opts->gloo.size >> dynamic;
  if (!in || opts->gloo.rank < 0 || opts->gloo.rank >= opts->gloo.size) {
    throw LibraryError("hvd.init on a worker joining a running elastic job: the rendezvous "
                       "store holds an assignment this build cannot read ('" + text +
                       "'); run the same hvdcompat on every host.");
  }
  opts->dynamic_process_sets = opts->dynamic_process_sets || dynamic != 0;
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    opts->process_set_ids.push_back(std::stoi(line.substr(0, colon)));
    opts->process_sets.push_back(ParseRanks(line.substr(colon + 1)));
  }
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
  WorldAgreement agreed;
  try {
    agreed = AgreeOnWorld(*gloo.store, prefix, old_rank, old_size, lost, timeout);
    result.survivors = agreed.survivors;
    result.joined = agreed.joined;
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
    const std::string late =
        "elastic reset on the Gloo controller: old rank " + std::to_string(old_rank) +
        " reached the reset after the others (old ranks " + JoinInts(result.survivors) +
        ") had agreed on the new world without it (it came more than " +
        std::to_string(timeout.count() / 1000) + " s after the first, "
        "HOROVOD_GLOO_TIMEOUT_SECONDS, or they had taken it for lost)";
    // Step 4: a live rank is not dropped while a launcher takes workers in.
    if (KnobString(Knob::kElasticDir).empty() || gloo.worker.empty()) {
      throw LibraryError(late + "; this rank leaves the job (only hvdcompatrun --gloo's "
                         "elastic launch takes a late rank back in).");
    }
    HVD_LOG(kWarning) << late << "; it joins the job again at the job's next commit";
    InitOptions again;
    again.controller = "gloo";
    again.dynamic_process_sets = opts.dynamic_process_sets;
    again.continue_timeline = true;
    again.gloo = gloo;
    again.gloo.join = gloo.worker;
    AwaitGlooJoin(&again, "old rank " + std::to_string(old_rank) + " (worker " + gloo.worker +
                              "), which came late to the job's elastic reset");
    result.survivors.clear();
    result.runtime = std::make_shared<Runtime>(again);
    return result;
  }
  gloo.key_prefix = prefix;
  gloo.rank = static_cast<int>(me - result.survivors.begin());
  const int kept = static_cast<int>(result.survivors.size());
  gloo.size = kept + result.joined;
  gloo.local_rank = gloo.local_size = gloo.cross_rank = gloo.cross_size = -1;
  opts.gloo = gloo;
  KeepSurvivingSets(old_sets, result.survivors, &opts, gloo.size);
  // Note [Growing in place on Gloo], step 2: the new workers' places.
  for (size_t k = 0; k < agreed.taken.size(); ++k) {
    gloo.store->Set(GrowKey(agreed.taken[k]) + "/world",
                    JoinAssignment(gloo.generation, kept + static_cast<int>(k), gloo.size, opts));
  }
  result.runtime = std::make_shared<Runtime>(opts);  // step 3
  HVD_LOG(kInfo) << "elastic reset on Gloo: old rank " << old_rank << " of " << old_size
                 << " is rank " << gloo.rank << " of " << gloo.size
                 << (result.joined ? " (" + std::to_string(result.joined) + " new worker(s))"
                                   : std::string());
  return result;
}

void LeaveGlooJob(Runtime& rt) {
  const GlooOptions& gloo = rt.gloo().options();
  const std::string prefix = "reset/" + std::to_string(gloo.generation + 1) + "/";
  // As the survivors do at step 1: their engines' last rounds end with this one's.
  rt.Abandon("this rank leaves the elastic job (its host was removed)");
  rt.Stop();
  try {
    gloo.store->Add(prefix + "settled/" + std::to_string(gloo.rank), 1);
    gloo.store->Wait({prefix + "world"}, rt.gloo().timeout());
  } catch (const std::exception& e) {
    HVD_LOG(kWarning) << "leaving the elastic job: the others' reset did not answer through "
                      << gloo.store->Describe() << " (" << e.what() << "); leaving anyway";
  }
}

void AwaitGlooJoin(InitOptions* opts, const std::string& who_text) {
  GlooOptions& gloo = opts->gloo;
  KeyValueStore& kv = *gloo.store;
  const std::string who = !who_text.empty() ? who_text
                                            : "hvd.init on worker " + gloo.join +
                                                  ", which joins a running elastic job";
  int64_t index = -1;
  try {
    index = kv.Add("grow/count", 1) - 1;
    kv.Set(GrowKey(index), gloo.join + " " + gloo.hostname);
  } catch (const std::exception& e) {
    throw LibraryError(who + ": could not register with the rendezvous store (" +
                       kv.Describe() + "): " + e.what() + ". Check that hvdcompatrun is still "
                       "running and reachable from this host.");
  }
  const std::string key = GrowKey(index) + "/world";
  // The job takes this worker in at its next reset (its next commit after
  // hvdcompatrun's notice): wait as long as the store answers.
  for (;;) {
    try {
      kv.Wait({key}, std::chrono::seconds(10));
      break;
    } catch (const std::exception&) {
      try {
        kv.Add("grow/count", 0);
      } catch (const std::exception& e) {
        throw LibraryError(who + ": the rendezvous store (" + kv.Describe() + ") stopped "
                           "answering while this worker waited for the job's next reset: " +
                           e.what() + ". hvdcompatrun, which serves it, has ended; this "
                           "worker leaves.");
      }
    }
  }
  ReadJoinAssignment(kv.Get(key), opts);
  gloo.key_prefix = "reset/" + std::to_string(gloo.generation) + "/";
  gloo.local_rank = gloo.local_size = gloo.cross_rank = gloo.cross_size = -1;
  if (!opts->requested_sets.empty() || !opts->refused.empty()) {
    HVD_LOG(kWarning) << who << ": its hvd.init(process_sets=...) is not used; it takes the "
                              "running job's process sets";
    opts->requested_sets.clear();
    opts->refused.clear();
  }
  HVD_LOG(kInfo) << who << ": taken in as rank " << gloo.rank << " of " << gloo.size;
}

}  // namespace hvdcompat
