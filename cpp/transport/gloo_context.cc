#include "transport/gloo_context.h"

#include <unistd.h>

#include <cstring>

#include "core/common.h"
#include "core/env.h"
#include "transport/control_transport.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace hvdcompat {

namespace {

// gloo's Store over the launch's store, under `prefix`.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<KeyValueStore> kv, std::string prefix,
               std::chrono::milliseconds timeout)
      : kv_(std::move(kv)), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    kv_->Set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    kv_->Wait({prefix_ + key}, timeout_);
    std::string v = kv_->Get(prefix_ + key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    kv_->Wait(full, timeout);
  }
  int64_t add(const std::string& key, int64_t value) override {
    return kv_->Add(prefix_ + key, value);
  }

 private:
  std::shared_ptr<KeyValueStore> kv_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

std::string ThisHost() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::string RankList(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > 16) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

void MinWords(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint64_t*>(c);
  const auto* x = static_cast<const uint64_t*>(a);
  const auto* y = static_cast<const uint64_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = std::min(x[i], y[i]);
}

}  // namespace

void ThrowGlooError(const std::string& what, const std::exception& e) {
  throw CommunicationError(what + ": " + e.what());
}

std::chrono::milliseconds GlooIdleTimeout() { return std::chrono::hours(24 * 365); }

void TopologyFromHosts(JobTopology* t) {
  const int n = static_cast<int>(t->hosts.size());
  std::vector<int> local_rank(n), local_size(n);
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      if (t->hosts[q] != t->hosts[r]) continue;
      ++local_size[r];
      if (q < r) ++local_rank[r];
    }
  }
  t->local_rank = local_rank[t->rank];
  t->local_size = local_size[t->rank];
  t->cross_rank = 0;
  t->cross_size = 0;
  for (int r = 0; r < n; ++r) {
    if (local_rank[r] != t->local_rank) continue;
    if (r < t->rank) ++t->cross_rank;
    ++t->cross_size;
  }
  t->homogeneous = true;
  for (int r = 0; r < n; ++r) t->homogeneous = t->homogeneous && local_size[r] == local_size[0];
}

GlooJob::GlooJob(const GlooOptions& options)
    : options_(options),
      timeout_(std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000))) {
  const std::string who = "hvd.init on the Gloo controller (rank " +
                          std::to_string(options.rank) + " of " + std::to_string(options.size) +
                          ")";
  if (!options_.store) {
    throw InvalidArgument(who + ": no rendezvous store was given; launch with torchrun or "
                          "hvdcompatrun --gloo, or pass InitOptions(store=...)");
  }
  if (options_.size < 1 || options_.rank < 0 || options_.rank >= options_.size) {
    throw InvalidArgument(who + ": the launch's rank and size are invalid (rank must be in [0, "
                          "size)); check RANK/WORLD_SIZE or HOROVOD_RANK/HOROVOD_SIZE");
  }
  if (options_.timeout_s <= 0) {
    throw InvalidArgument(who + ": the Gloo timeout must be positive (got " +
                          std::to_string(options_.timeout_s) + " s)");
  }
  if (options_.peer_timeout_s < 0) {
    options_.peer_timeout_s = KnobDouble(Knob::kGlooPeerTimeoutSeconds);
  }
  gloo::transport::tcp::attr attr;
  if (!options_.iface.empty()) {
    attr.iface = options_.iface;
    address_ = "interface " + options_.iface;
  } else {
    attr.hostname = options_.bind_host.empty() ? ThisHost() : options_.bind_host;
    address_ = "host " + attr.hostname;
  }
  try {
    device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw LibraryError(who + ": Gloo could not open its TCP device on " + address_ + " (" +
                       e.what() + "); name a reachable interface with HOROVOD_GLOO_IFACE "
                       "(hvdcompatrun --network-interfaces) or GLOO_SOCKET_IFNAME, or an "
                       "address this host owns");
  }
  Join();
  topo_.rank = options_.rank;
  topo_.size = options_.size;
  const std::string host = options_.hostname.empty() ? ThisHost() : options_.hostname;
  topo_.hosts = AllgatherStrings(host);
  if (options_.local_rank >= 0 && options_.local_size > 0 && options_.cross_rank >= 0 &&
      options_.cross_size > 0) {
    topo_.local_rank = options_.local_rank;
    topo_.local_size = options_.local_size;
    topo_.cross_rank = options_.cross_rank;
    topo_.cross_size = options_.cross_size;
    uint64_t sizes[2] = {static_cast<uint64_t>(topo_.local_size),
                         ~static_cast<uint64_t>(topo_.local_size)};
    AllreduceMin(sizes, 2);
    topo_.homogeneous = sizes[0] == ~sizes[1];
  } else {
    TopologyFromHosts(&topo_);
  }
}

GlooJob::~GlooJob() = default;

void GlooJob::Join() {
  const int rank = options_.rank, size = options_.size;
  const std::string where = options_.store->Describe();
  const std::string who = "hvd.init on the Gloo controller (rank " + std::to_string(rank) + ")";
  try {
    options_.store->Set(options_.key_prefix + "join/" + std::to_string(rank),
                        std::to_string(size));
  } catch (const std::exception& e) {
    throw LibraryError(who + ": could not write to the rendezvous store (" + where + "): " +
                       e.what() + ". Check that the launch's store is reachable (MASTER_ADDR/"
                       "MASTER_PORT, HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT) and serving.");
  }
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(options_.key_prefix + "join/" + std::to_string(r));
  try {
    options_.store->Wait(keys, timeout_);
  } catch (const std::exception& e) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      try {
        options_.store->Wait({keys[r]}, std::chrono::milliseconds(1));
      } catch (const std::exception&) {
        missing.push_back(r);
      }
    }
    throw LibraryError(
        who + ": ranks [" + RankList(missing) + "] of " + std::to_string(size) +
        " did not join the rendezvous at " + where + " within " +
        std::to_string(options_.timeout_s) + " s (" + e.what() + "). They did not start, "
        "failed before hvd.init(), run another world size, or use the MPI controller; every "
        "rank must run HOROVOD_CONTROLLER=gloo with the same size (raise the wait with "
        "--gloo-timeout-seconds / HOROVOD_GLOO_TIMEOUT_SECONDS).");
  }
  std::vector<int> other_size;
  std::string sizes;
  for (int r = 0; r < size; ++r) {
    const std::string v = options_.store->Get(keys[r]);
    if (v != std::to_string(size)) {
      other_size.push_back(r);
      sizes += (sizes.empty() ? "" : ", ") + v;
    }
  }
  if (!other_size.empty()) {
    throw InvalidArgument(who + ": ranks [" + RankList(other_size) + "] joined the rendezvous at " +
                          where + " with world size " + sizes + ", this rank with " +
                          std::to_string(size) + "; every rank must be launched with the same "
                          "size (the keys may also be left from another job on the same store: "
                          "use a fresh store or port)");
  }
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(timeout_);
  try {
    auto store = std::make_shared<StoreAdapter>(options_.store, options_.key_prefix + "mesh/",
                                                timeout_);
    ctx->connectFullMesh(store, device_);
  } catch (const std::exception& e) {
    throw LibraryError(who + ": Gloo could not connect its TCP pairs to the other " +
                       std::to_string(size - 1) + " ranks (this rank bound to " + address_ +
                       ", rendezvous at " + where + "): " + e.what() +
                       ". Check that every host can reach the others' addresses (set "
                       "HOROVOD_GLOO_IFACE or GLOO_SOCKET_IFNAME to the interface they share) "
                       "and that every rank is still running.");
  }
  job_ = ctx;
  std::vector<int> all(size);
  for (int r = 0; r < size; ++r) all[r] = r;
  watch_ = std::make_unique<GlooWatch>(
      std::chrono::milliseconds(static_cast<int64_t>(options_.peer_timeout_s * 1000)));
  watch_->Watch(job_, all, "the job");
}

void GlooJob::AllgatherFixed(const void* mine, size_t bytes, void* all) {
  try {
    gloo::AllgathervOptions o(job_);
    std::vector<char> in(static_cast<const char*>(mine), static_cast<const char*>(mine) + bytes);
    in.resize(std::max<size_t>(bytes, 1));
    std::vector<char> out(std::max<size_t>(bytes, 1) * options_.size);
    o.setInput(in.data(), std::max<size_t>(bytes, 1));
    o.setOutput(out.data(), std::vector<size_t>(options_.size, std::max<size_t>(bytes, 1)));
    o.setTimeout(GlooIdleTimeout());
    gloo::allgatherv(o);
    for (int r = 0; r < options_.size; ++r) {
      std::memcpy(static_cast<char*>(all) + r * bytes, out.data() + r * std::max<size_t>(bytes, 1),
                  bytes);
    }
  } catch (const gloo::Exception& e) {
    ThrowGlooError("Gloo job allgather", e);
  }
}

std::vector<std::string> GlooJob::AllgatherStrings(const std::string& mine) {
  const int size = options_.size;
  std::vector<uint64_t> lens(size);
  uint64_t len = mine.size();
  AllgatherFixed(&len, sizeof(len), lens.data());
  std::vector<size_t> counts(size);
  size_t total = 0;
  for (int r = 0; r < size; ++r) total += counts[r] = lens[r] + 1;  // +1: never empty
  std::string in = mine + '\0';
  std::vector<char> out(total);
  try {
    gloo::AllgathervOptions o(job_);
    o.setInput(&in[0], in.size());
    o.setOutput(out.data(), counts);
    o.setTimeout(GlooIdleTimeout());
    gloo::allgatherv(o);
  } catch (const gloo::Exception& e) {
    ThrowGlooError("Gloo job allgather", e);
  }
  std::vector<std::string> all(size);
  size_t at = 0;
  for (int r = 0; r < size; ++r) {
    all[r].assign(out.data() + at, lens[r]);
    at += counts[r];
  }
  return all;
}

void GlooJob::AllreduceMin(uint64_t* words, int n) {
  try {
    gloo::AllreduceOptions o(job_);
    o.setOutput(words, static_cast<size_t>(n));
    o.setReduceFunction(&MinWords);
    o.setTimeout(GlooIdleTimeout());
    gloo::allreduce(o);
  } catch (const gloo::Exception& e) {
    ThrowGlooError("Gloo job agreement round", e);
  }
}

std::shared_ptr<gloo::Context> GlooJob::NewContext() {
  try {
    gloo::rendezvous::ContextFactory factory(job_);
    auto ctx = factory.makeContext(device_);
    ctx->setTimeout(timeout_);
    std::vector<int> all(options_.size);
    for (int r = 0; r < options_.size; ++r) all[r] = r;
    watch_->Watch(ctx, all, "the job");
    return ctx;
  } catch (const gloo::Exception& e) {
    ThrowGlooError("Gloo: creating a worker's context over rank " + std::to_string(options_.rank) +
                   "'s job context", e);
  }
}

std::shared_ptr<gloo::Context> GlooJob::SubsetContext(const std::vector<int>& ranks,
                                                      const std::string& prefix) {
  const auto pos = std::find(ranks.begin(), ranks.end(), options_.rank);
  if (pos == ranks.end()) throw InternalError("SubsetContext on a rank outside the set");
  auto ctx = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(pos - ranks.begin()),
                                                         static_cast<int>(ranks.size()));
  ctx->setTimeout(timeout_);
  try {
    auto store = std::make_shared<StoreAdapter>(options_.store, options_.key_prefix + prefix,
                                                timeout_);
    ctx->connectFullMesh(store, device_);
  } catch (const std::exception& e) {
    throw CommunicationError("Gloo: connecting process set ranks [" + RankList(ranks) +
                             "] on rank " + std::to_string(options_.rank) + " through " +
                             options_.store->Describe() + " failed: " + e.what() +
                             ". Every rank of the set must register it.");
  }
  watch_->Watch(ctx, ranks, "process set [" + RankList(ranks) + "]");
  return ctx;
}

}  // namespace hvdcompat
