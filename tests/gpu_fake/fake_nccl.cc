// The NCCL half of the host-only fake (see fake_cudart.cc): collectives
// between processes through files in $FAKE_NCCL_DIR/<unique id>/.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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
  uint64_t seq = 0;
  int ops = 0;
  ncclResult_t async_error = ncclSuccess;
  bool aborted = false;
  std::map<int, uint64_t> sent, received;
  std::map<int, std::pair<double, ncclDataType_t>> premul;  // op -> scalar
  int next_op = ncclNumOps;
  std::string last_error;
};

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

bool WaitRead(const std::string& path, std::vector<char>* out) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int sleep_us = 20;
  while (true) {
    std::ifstream f(path, std::ios::binary);
    if (f) {
      out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
      return true;
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
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
    if (!WaitRead(stem + std::to_string(r), &(*all)[r])) {
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

ncclResult_t ReduceInto(FakeComm* c, const std::vector<std::vector<char>>& all, size_t offset,
                        size_t count, ncclDataType_t type, ncclRedOp_t op, void* out) {
  bool premul = false;
  double scalar = 1.0;
  if (op >= ncclNumOps) {
    auto it = c->premul.find(op);
    if (it == c->premul.end()) return ncclInvalidArgument;
    premul = true;
    scalar = it->second.first;
  }
  if (op == ncclAvg) g_stats[kAvgOps]++;
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

// Group state of the calling thread: queued calls run at ncclGroupEnd.
struct Group {
  int depth = 0;
  std::vector<std::function<ncclResult_t()>> sends;
  std::vector<std::function<ncclResult_t()>> rest;
};
thread_local Group t_group;

ncclResult_t Run(bool is_send, std::function<ncclResult_t()> fn) {
  if (t_group.depth > 0) {
    (is_send ? t_group.sends : t_group.rest).push_back(std::move(fn));
    return ncclSuccess;
  }
  return fn();
}

// Common entry checks; true when the call should do nothing more (an
// injected failure has "hung" it).
bool Begin(FakeComm* c, ncclResult_t* rc) {
  *rc = ncclSuccess;
  if (!c || c->aborted) {
    g_stats[kMisuse]++;
    *rc = ncclInvalidUsage;
    return true;
  }
  int fail_after = EnvInt("FAKE_NCCL_FAIL_AFTER", -1);
  if (fail_after >= 0 && c->ops >= fail_after) {
    c->async_error = ncclRemoteError;
    c->last_error = "injected remote error";
    g_hung = true;
    return true;
  }
  ++c->ops;
  return false;
}

}  // namespace

extern "C" {

// -------------------------------------------------------------------- NCCL

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
  mkdir(BaseDir().c_str(), 0777);
  c->dir = BaseDir() + "/" + std::string(id.internal);
  mkdir(c->dir.c_str(), 0777);
  *comm = reinterpret_cast<ncclComm_t>(c);
  g_stats[kCommsLive]++;
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c || c->aborted) {
    g_stats[kMisuse]++;
    return ncclInvalidUsage;
  }
  delete c;
  g_stats[kCommsLive]--;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c || c->aborted) {
    g_stats[kMisuse]++;
    return ncclInvalidUsage;
  }
  // Kept (marked) so that later use is detected as misuse.
  c->aborted = true;
  g_hung = false;  // aborting releases the stuck "kernels"
  g_stats[kAborts]++;
  g_stats[kCommsLive]--;
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c || c->aborted) {
    g_stats[kMisuse]++;
    return ncclInvalidUsage;
  }
  *err = c->async_error;
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kAllReduces]++;
  return Run(false, [=] {
    ncclResult_t rc;
    if (Begin(c, &rc)) return rc;
    std::vector<std::vector<char>> all;
    if (!Exchange(c, send, count * TypeSize(type), &all)) return ncclSystemError;
    return ReduceInto(c, all, 0, count, type, op, recv);
  });
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kBroadcasts]++;
  return Run(false, [=] {
    ncclResult_t rc;
    if (Begin(c, &rc)) return rc;
    if (root < 0 || root >= c->nranks) return ncclInvalidArgument;
    const size_t bytes = count * TypeSize(type);
    std::vector<std::vector<char>> all;
    if (!Exchange(c, send, c->rank == root ? bytes : 0, &all)) return ncclSystemError;
    if (all[root].size() != bytes) return ncclInvalidArgument;
    std::memcpy(recv, all[root].data(), bytes);
    return ncclSuccess;
  });
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kAllGathers]++;
  return Run(false, [=] {
    ncclResult_t rc;
    if (Begin(c, &rc)) return rc;
    const size_t bytes = count * TypeSize(type);
    std::vector<std::vector<char>> all;
    if (!Exchange(c, send, bytes, &all)) return ncclSystemError;
    for (int r = 0; r < c->nranks; ++r) {
      if (all[r].size() != bytes) return ncclInvalidArgument;
      std::memcpy(static_cast<char*>(recv) + r * bytes, all[r].data(), bytes);
    }
    return ncclSuccess;
  });
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kReduceScatters]++;
  return Run(false, [=] {
    ncclResult_t rc;
    if (Begin(c, &rc)) return rc;
    std::vector<std::vector<char>> all;
    if (!Exchange(c, send, count * TypeSize(type) * c->nranks, &all)) return ncclSystemError;
    return ReduceInto(c, all, count * c->rank, count, type, op, recv);
  });
}
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kSends]++;
  return Run(true, [=] {
    ncclResult_t rc;
    if (Begin(c, &rc)) return rc;
    uint64_t n = c->sent[peer]++;
    WriteFile(c->dir + "/p2p." + std::to_string(c->rank) + "." + std::to_string(peer) + "." +
                  std::to_string(n),
              send, count * TypeSize(type));
    return ncclSuccess;
  });
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kRecvs]++;
  return Run(false, [=] {
    ncclResult_t rc;
    if (Begin(c, &rc)) return rc;
    uint64_t n = c->received[peer]++;
    std::string path = c->dir + "/p2p." + std::to_string(peer) + "." + std::to_string(c->rank) +
                       "." + std::to_string(n);
    std::vector<char> data;
    if (!WaitRead(path, &data)) return ncclSystemError;
    std::remove(path.c_str());
    if (data.size() != count * TypeSize(type)) return ncclInvalidArgument;
    std::memcpy(recv, data.data(), data.size());
    return ncclSuccess;
  });
}
ncclResult_t ncclGroupStart(void) {
  if (t_group.depth++ == 0) g_stats[kGroups]++;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
  if (t_group.depth <= 0) return ncclInvalidUsage;
  if (--t_group.depth > 0) return ncclSuccess;
  auto sends = std::move(t_group.sends);
  auto rest = std::move(t_group.rest);
  t_group = Group();
  ncclResult_t result = ncclSuccess;
  for (auto& f : sends) {
    ncclResult_t rc = f();
    if (rc != ncclSuccess && result == ncclSuccess) result = rc;
  }
  for (auto& f : rest) {
    ncclResult_t rc = f();
    if (rc != ncclSuccess && result == ncclSuccess) result = rc;
  }
  return result;
}
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c || residence != ncclScalarHostImmediate) return ncclInvalidArgument;
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
  if (!c || !c->premul.erase(op)) return ncclInvalidArgument;
  g_stats[kRedOpDestroys]++;
  return ncclSuccess;
}

}  // extern "C"
