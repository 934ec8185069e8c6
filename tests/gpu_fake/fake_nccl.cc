// The NCCL half of the host-only fake (see fake_cudart.cc): collectives
// between processes through files in $FAKE_NCCL_DIR/<unique id>/. Each call
// is queued on the stream it names and runs there in stream order; a group
// runs as one operation at ncclGroupEnd (sends first, so grouped send/recv
// pairs cannot deadlock). Failures while running become the communicator's
// asynchronous error, as in NCCL.
//
// Knobs (environment): FAKE_NCCL_VERSION (21805); FAKE_NCCL_FAIL_AFTER=N:
// the N+1-th call on a communicator is doomed: it reports ncclRemoteError
// asynchronously (at once, or FAKE_NCCL_ERROR_DELAY_MS after it starts
// running) and its stream stays stuck on it, as a kernel waiting for a dead
// peer, until the communicator is aborted; FAKE_NCCL_HANG_CALL_MS keeps every
// later doomed call from returning that long (a launch stuck in NCCL while
// the first failure is being handled);
// FAKE_NCCL_CALL_US widens every call (so overlapping calls are seen).
// Counted misuse: calls on one device overlapping from two threads, an abort
// while another thread is inside a call on the comm, use after abort/destroy.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "fake_common.h"
#include "nccl/nccl_min.h"

namespace {

using namespace fake;

size_t TypeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

// ---------------------------------------------------------------- comms

struct FakeComm {
  std::string dir;
  int nranks = 1;
  int rank = 0;
  int device = 0;
  uint64_t seq = 0;  // collectives run (stream worker)
  int ops = 0;       // calls issued (host thread)
  std::atomic<int> async_error{ncclSuccess};
  std::atomic<bool> aborted{false};
  std::atomic<bool> destroyed{false};
  std::atomic<int> in_call{0};
  std::map<int, uint64_t> sent, received;
  std::map<int, std::pair<double, ncclDataType_t>> premul;  // op -> scalar
  int next_op = ncclNumOps;
  std::string last_error;
};

std::mutex g_abort_mu;
std::mutex g_ids_mu;
std::string g_comm_ids;  // the unique id of every communicator made here, one per line
std::string g_comm_members;  // "<unique id> <rank> <nranks>" of each of them, one per line
std::condition_variable g_abort_cv;
std::atomic<int> g_device_calls[64];

// Marks a host thread inside an NCCL call on `c` (and its device).
class CallScope {
 public:
  explicit CallScope(FakeComm* c) : c_(c), dev_(c ? c->device & 63 : 0) {
    if (g_device_calls[dev_]++ > 0) g_stats[kConcurrentLaunches]++;
    if (c_) c_->in_call++;
    int us = EnvInt("FAKE_NCCL_CALL_US", 0);
    if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
  }
  ~CallScope() {
    if (c_) c_->in_call--;
    g_device_calls[dev_]--;
  }

 private:
  FakeComm* c_;
  int dev_;
};

void SetAsyncError(FakeComm* c, ncclResult_t rc, const std::string& why) {
  int expected = ncclSuccess;
  if (c->async_error.load() == ncclSuccess) c->last_error = why;
  c->async_error.compare_exchange_strong(expected, rc);
}

std::string BaseDir() {
  const char* d = std::getenv("FAKE_NCCL_DIR");
  return d && *d ? d : "/tmp/fake_nccl";
}

void WriteFile(const std::string& path, const void* data, size_t bytes) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  }
  std::rename(tmp.c_str(), path.c_str());
}

bool WaitRead(const std::string& path, std::vector<char>* out,
              const FakeComm* c = nullptr) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int sleep_us = 20;
  while (true) {
    std::ifstream f(path, std::ios::binary);
    if (f) {
      out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
      return true;
    }
    if (std::chrono::steady_clock::now() > deadline || (c && c->aborted)) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, 2000);
  }
}

// Every rank's `bytes` from `mine`, in rank order.
bool Exchange(FakeComm* c, const void* mine, size_t bytes, std::vector<std::vector<char>>* all) {
  uint64_t seq = c->seq++;
  std::string stem = c->dir + "/" + std::to_string(seq) + ".";
  WriteFile(stem + std::to_string(c->rank), mine, bytes);
  all->assign(c->nranks, {});
  for (int r = 0; r < c->nranks; ++r) {
    if (!WaitRead(stem + std::to_string(r), &(*all)[r], c)) {
      c->last_error = "timed out waiting for rank " + std::to_string(r);
      return false;
    }
  }
  // Everyone wrote this round, so everyone finished reading the previous one.
  if (seq > 0) std::remove((c->dir + "/" + std::to_string(seq - 1) + "." +
                            std::to_string(c->rank)).c_str());
  return true;
}

template <typename T>
void ReduceTyped(const std::vector<std::vector<char>>& all, size_t offset, size_t count,
                 ncclRedOp_t op, double scalar, bool premul, void* out, int n) {
  std::vector<double> acc(count);
  for (int r = 0; r < n; ++r) {
    const T* in = reinterpret_cast<const T*>(all[r].data()) + offset;
    for (size_t i = 0; i < count; ++i) {
      double v = premul ? static_cast<double>(static_cast<T>(in[i] * static_cast<T>(scalar)))
                        : static_cast<double>(in[i]);
      if (r == 0) { acc[i] = v; continue; }
      switch (op) {
        case ncclProd: acc[i] *= v; break;
        case ncclMax: acc[i] = std::max(acc[i], v); break;
        case ncclMin: acc[i] = std::min(acc[i], v); break;
        default: acc[i] += v; break;
      }
    }
  }
  T* o = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    if (op == ncclAvg) {
      if (std::is_integral<T>::value) {
        o[i] = static_cast<T>(static_cast<long long>(acc[i]) / n);
      } else {
        o[i] = static_cast<T>(acc[i] / n);
      }
    } else {
      o[i] = static_cast<T>(acc[i]);
    }
  }
}

void Reduce16(const std::vector<std::vector<char>>& all, size_t offset, size_t count,
              ncclRedOp_t op, double scalar, bool premul, void* out, int n, bool bf) {
  auto to_f = bf ? Bf16ToFloat : HalfToFloat;
  auto from_f = bf ? FloatToBf16 : FloatToHalf;
  float s = to_f(from_f(static_cast<float>(scalar)));
  uint16_t* o = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < count; ++i) {
    float acc = 0;
    for (int r = 0; r < n; ++r) {
      float v = to_f(reinterpret_cast<const uint16_t*>(all[r].data())[offset + i]);
      if (premul) v = to_f(from_f(v * s));
      if (r == 0) { acc = v; continue; }
      switch (op) {
        case ncclProd: acc *= v; break;
        case ncclMax: acc = std::max(acc, v); break;
        case ncclMin: acc = std::min(acc, v); break;
        default: acc += v; break;
      }
    }
    if (op == ncclAvg) acc /= n;
    o[i] = from_f(acc);
  }
}

// The operator as it is at call time: NCCL lets a PreMulSum be destroyed as
// soon as the call that uses it returned, long before the stream runs it.
struct OpSpec {
  ncclRedOp_t op = ncclSum;
  bool premul = false;
  double scalar = 1.0;
};

bool ResolveOp(FakeComm* c, ncclRedOp_t op, OpSpec* out) {
  out->op = op;
  if (op >= ncclNumOps) {
    auto it = c->premul.find(op);
    if (it == c->premul.end()) return false;
    out->premul = true;
    out->scalar = it->second.first;
  }
  if (op == ncclAvg) g_stats[kAvgOps]++;
  return true;
}

ncclResult_t ReduceInto(FakeComm* c, const std::vector<std::vector<char>>& all, size_t offset,
                        size_t count, ncclDataType_t type, const OpSpec& spec, void* out) {
  const ncclRedOp_t op = spec.op;
  const bool premul = spec.premul;
  const double scalar = spec.scalar;
  int n = c->nranks;
  switch (type) {
    case ncclInt8: ReduceTyped<int8_t>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclUint8: ReduceTyped<uint8_t>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclInt32: ReduceTyped<int32_t>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclUint32: ReduceTyped<uint32_t>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclInt64: ReduceTyped<int64_t>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclUint64: ReduceTyped<uint64_t>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclFloat32: ReduceTyped<float>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclFloat64: ReduceTyped<double>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclFloat16: Reduce16(all, offset, count, op, scalar, premul, out, n, false); break;
    case ncclBfloat16: Reduce16(all, offset, count, op, scalar, premul, out, n, true); break;
    default: return ncclInvalidArgument;
  }
  return ncclSuccess;
}

// Runs one issued call on its stream's worker.
void Execute(FakeComm* c, bool doomed, const std::function<ncclResult_t()>& fn) {
  if (doomed) {
    int delay = EnvInt("FAKE_NCCL_ERROR_DELAY_MS", 0);
    if (delay > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      SetAsyncError(c, ncclRemoteError, "injected remote error");
    }
    // A kernel waiting for a dead peer: only an abort releases it.
    std::unique_lock<std::mutex> lock(g_abort_mu);
    g_abort_cv.wait(lock, [c] { return c->aborted.load(); });
    return;
  }
  if (c->aborted) return;  // an aborted communicator drops its queued work
  ncclResult_t rc = fn();
  if (rc != ncclSuccess) SetAsyncError(c, rc, "collective failed: " + c->last_error);
}

struct Issued {
  FakeComm* comm;
  bool doomed;
  std::function<ncclResult_t()> fn;
  cudaStream_t stream;
  std::vector<const void*> touched;
};

// Group state of the calling thread: issued calls are queued at ncclGroupEnd.
struct Group {
  int depth = 0;
  std::vector<Issued> sends;
  std::vector<Issued> rest;
};
thread_local Group t_group;

// Host-side entry checks of a call: misuse, or whether it is doomed.
ncclResult_t Begin(FakeComm* c, bool* doomed) {
  *doomed = false;
  if (!c || c->aborted || c->destroyed) {
    g_stats[kMisuse]++;
    return ncclInvalidUsage;
  }
  int fail_after = EnvInt("FAKE_NCCL_FAIL_AFTER", -1);
  if (fail_after >= 0 && c->ops >= fail_after) {
    *doomed = true;
    if (EnvInt("FAKE_NCCL_ERROR_DELAY_MS", 0) <= 0) {
      SetAsyncError(c, ncclRemoteError, "injected remote error");
    }
    int hang = EnvInt("FAKE_NCCL_HANG_CALL_MS", 0);
    if (hang > 0 && c->ops > fail_after) {
      std::this_thread::sleep_for(std::chrono::milliseconds(hang));
    }
  }
  ++c->ops;
  return ncclSuccess;
}

ncclResult_t Issue(bool is_send, Issued call) {
  if (t_group.depth > 0) {
    (is_send ? t_group.sends : t_group.rest).push_back(std::move(call));
    return ncclSuccess;
  }
  FakeComm* c = call.comm;
  const bool doomed = call.doomed;
  auto fn = std::move(call.fn);
  Enqueue(ResolveStream(call.stream), [c, doomed, fn] { Execute(c, doomed, fn); },
          call.touched);
  return ncclSuccess;
}

}  // namespace

extern "C" {

// -------------------------------------------------------------------- NCCL

// The unique ids of the communicators made in this process, one per line, in
// creation order (NUL-terminated, cut to `len`); returns the full length.
int fake_nccl_comm_ids(char* out, int len) {
  std::lock_guard<std::mutex> lock(g_ids_mu);
  if (len > 0) {
    std::snprintf(out, static_cast<size_t>(len), "%s", g_comm_ids.c_str());
  }
  return static_cast<int>(g_comm_ids.size());
}

// The same communicators as "<unique id> <rank> <nranks>" lines: which rank
// of how many this process joined each one as.
int fake_nccl_comm_members(char* out, int len) {
  std::lock_guard<std::mutex> lock(g_ids_mu);
  if (len > 0) {
    std::snprintf(out, static_cast<size_t>(len), "%s", g_comm_members.c_str());
  }
  return static_cast<int>(g_comm_members.size());
}

ncclResult_t ncclGetVersion(int* v) { *v = EnvInt("FAKE_NCCL_VERSION", 21805); return ncclSuccess; }
const char* ncclGetErrorString(ncclResult_t r) {
  static thread_local char buf[64];
  std::snprintf(buf, sizeof(buf), "fake NCCL error %d", static_cast<int>(r));
  return buf;
}
const char* ncclGetLastError(ncclComm_t comm) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  return c ? c->last_error.c_str() : "";
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id->internal, 0, sizeof(id->internal));
  std::random_device rd;
  std::snprintf(id->internal, sizeof(id->internal), "fake-%d-%08x%08x", getpid(), rd(), rd());
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  auto* c = new FakeComm();
  c->nranks = nranks;
  c->rank = rank;
  c->device = CurrentDevice();  // as NCCL: the communicator's device is the current one
  mkdir(BaseDir().c_str(), 0777);
  c->dir = BaseDir() + "/" + std::string(id.internal);
  mkdir(c->dir.c_str(), 0777);
  *comm = reinterpret_cast<ncclComm_t>(c);
  g_stats[kCommsLive]++;
  g_stats[kCommInits]++;
  {
    std::lock_guard<std::mutex> lock(g_ids_mu);
    g_comm_ids += std::string(id.internal) + "\n";
    g_comm_members += std::string(id.internal) + " " + std::to_string(rank) + " " +
                      std::to_string(nranks) + "\n";
  }
  return ncclSuccess;
}
// Communicators are never deleted: queued work and late pollers may still
// look at them; they are marked so that later use counts as misuse.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c || c->aborted || c->destroyed) {
    g_stats[kMisuse]++;
    return ncclInvalidUsage;
  }
  CallScope scope(c);
  c->destroyed = true;
  g_stats[kCommsLive]--;
  g_stats[kCommDestroys]++;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c || c->aborted || c->destroyed) {
    g_stats[kMisuse]++;
    return ncclInvalidUsage;
  }
  if (c->in_call.load() > 0) g_stats[kAbortInCall]++;  // NCCL forbids this
  CallScope scope(c);
  // Counted before the stuck "kernels" are released: a check woken by the
  // release reads the count (rank_checks.py run_async_watchdog).
  g_stats[kAborts]++;
  g_stats[kCommsLive]--;
  {
    std::lock_guard<std::mutex> lock(g_abort_mu);
    c->aborted = true;
  }
  g_abort_cv.notify_all();  // releases the stuck "kernels"
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c || c->aborted || c->destroyed) {
    g_stats[kMisuse]++;
    return ncclInvalidUsage;
  }
  *err = static_cast<ncclResult_t>(c->async_error.load());
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kAllReduces]++;
  CallScope scope(c);
  bool doomed;
  if (ncclResult_t rc = Begin(c, &doomed)) return rc;
  OpSpec spec;
  if (!ResolveOp(c, op, &spec)) return ncclInvalidArgument;
  return Issue(false, {c, doomed, [=] {
    std::vector<std::vector<char>> all;
    if (!Exchange(c, send, count * TypeSize(type), &all)) return ncclSystemError;
    return ReduceInto(c, all, 0, count, type, spec, recv);
  }, stream, {send, recv}});
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kBroadcasts]++;
  CallScope scope(c);
  bool doomed;
  if (ncclResult_t rc = Begin(c, &doomed)) return rc;
  if (root < 0 || root >= c->nranks) return ncclInvalidArgument;
  return Issue(false, {c, doomed, [=] {
    const size_t bytes = count * TypeSize(type);
    std::vector<std::vector<char>> all;
    if (!Exchange(c, send, c->rank == root ? bytes : 0, &all)) return ncclSystemError;
    if (all[root].size() != bytes) return ncclInvalidArgument;
    std::memcpy(recv, all[root].data(), bytes);
    return ncclSuccess;
  }, stream, {send, recv}});
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kAllGathers]++;
  CallScope scope(c);
  bool doomed;
  if (ncclResult_t rc = Begin(c, &doomed)) return rc;
  return Issue(false, {c, doomed, [=] {
    const size_t bytes = count * TypeSize(type);
    std::vector<std::vector<char>> all;
    if (!Exchange(c, send, bytes, &all)) return ncclSystemError;
    for (int r = 0; r < c->nranks; ++r) {
      if (all[r].size() != bytes) return ncclInvalidArgument;
      std::memcpy(static_cast<char*>(recv) + r * bytes, all[r].data(), bytes);
    }
    return ncclSuccess;
  }, stream, {send, recv}});
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kReduceScatters]++;
  CallScope scope(c);
  bool doomed;
  if (ncclResult_t rc = Begin(c, &doomed)) return rc;
  OpSpec spec;
  if (!ResolveOp(c, op, &spec)) return ncclInvalidArgument;
  return Issue(false, {c, doomed, [=] {
    std::vector<std::vector<char>> all;
    if (!Exchange(c, send, count * TypeSize(type) * c->nranks, &all)) return ncclSystemError;
    return ReduceInto(c, all, count * c->rank, count, type, spec, recv);
  }, stream, {send, recv}});
}
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kSends]++;
  CallScope scope(c);
  bool doomed;
  if (ncclResult_t rc = Begin(c, &doomed)) return rc;
  return Issue(true, {c, doomed, [=] {
    uint64_t n = c->sent[peer]++;
    WriteFile(c->dir + "/p2p." + std::to_string(c->rank) + "." + std::to_string(peer) + "." +
                  std::to_string(n),
              send, count * TypeSize(type));
    return ncclSuccess;
  }, stream, {send}});
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kRecvs]++;
  CallScope scope(c);
  bool doomed;
  if (ncclResult_t rc = Begin(c, &doomed)) return rc;
  return Issue(false, {c, doomed, [=] {
    uint64_t n = c->received[peer]++;
    std::string path = c->dir + "/p2p." + std::to_string(peer) + "." + std::to_string(c->rank) +
                       "." + std::to_string(n);
    std::vector<char> data;
    if (!WaitRead(path, &data, c)) return ncclSystemError;
    std::remove(path.c_str());
    if (data.size() != count * TypeSize(type)) return ncclInvalidArgument;
    std::memcpy(recv, data.data(), data.size());
    return ncclSuccess;
  }, stream, {recv}});
}
ncclResult_t ncclGroupStart(void) {
  if (t_group.depth++ == 0) g_stats[kGroups]++;
  return ncclSuccess;
}
// The group runs as one operation on its stream: sends first, then the rest.
ncclResult_t ncclGroupEnd(void) {
  if (t_group.depth <= 0) return ncclInvalidUsage;
  if (--t_group.depth > 0) return ncclSuccess;
  std::vector<Issued> calls = std::move(t_group.sends);
  for (auto& r : t_group.rest) calls.push_back(std::move(r));
  t_group = Group();
  if (calls.empty()) return ncclSuccess;
  CallScope scope(calls[0].comm);
  std::vector<const void*> touched;
  for (const auto& call : calls) {
    if (call.stream != calls[0].stream || call.comm->device != calls[0].comm->device) {
      g_stats[kMisuse]++;  // the core never mixes streams or devices in one group
      return ncclInvalidUsage;
    }
    touched.insert(touched.end(), call.touched.begin(), call.touched.end());
  }
  Enqueue(ResolveStream(calls[0].stream), [calls] {
    for (const auto& call : calls) Execute(call.comm, call.doomed, call.fn);
  }, touched);
  return ncclSuccess;
}
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c || residence != ncclScalarHostImmediate) return ncclInvalidArgument;
  CallScope scope(c);
  double s;
  switch (type) {
    case ncclFloat16: s = HalfToFloat(*static_cast<uint16_t*>(scalar)); break;
    case ncclBfloat16: s = Bf16ToFloat(*static_cast<uint16_t*>(scalar)); break;
    case ncclFloat32: s = *static_cast<float*>(scalar); break;
    case ncclFloat64: s = *static_cast<double*>(scalar); break;
    default: return ncclInvalidArgument;
  }
  *op = static_cast<ncclRedOp_t>(c->next_op++);
  c->premul[*op] = {s, type};
  g_stats[kPreMulSums]++;
  return ncclSuccess;
}
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c) return ncclInvalidArgument;
  CallScope scope(c);
  if (!c->premul.erase(op)) return ncclInvalidArgument;
  g_stats[kRedOpDestroys]++;
  return ncclSuccess;
}

}  // extern "C"
