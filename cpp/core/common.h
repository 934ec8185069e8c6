// Shared vocabulary of the core: data types, reduce ops, op types, status,
// buffer descriptions and the check macros. Everything here is plain data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace hvdcompat {

// A hint to the CPU inside a busy-wait loop (the thread keeps its core;
// Note [Engine-owned waiting] says why the engine never yields it instead).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Values are part of the binding contract (exported to Python, one source of
// truth). Order matters only for the wire encoding.
enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kBFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBool = 9,
};
constexpr int kNumDataTypes = 10;

// Horovod's numbering: Average=0, Sum=1, Adasum=2, Min=3, Max=4, Product=5.
enum class ReduceOp : uint8_t {
  kAverage = 0,
  kSum = 1,
  kAdasum = 2,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};

enum class OpType : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
};

size_t DataTypeSize(DataType dtype);
const char* DataTypeName(DataType dtype);
bool IsFloatingPoint(DataType dtype);
const char* ReduceOpName(ReduceOp op);
const char* OpTypeName(OpType op);

// Device id of host memory; CUDA devices are >= 0.
constexpr int kCpuDevice = -1;

// How a failure reaches Python. kInvalidArgument and kPrecondition are the
// caller's mistakes (ValueError / TypeError on the calling rank, or a
// cross-rank mismatch); kAborted and kInternal are failures of the job
// (HorovodInternalError).
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,
  kPrecondition = 2,  // ranks disagree (dtype, shape, op, root, ...)
  kAborted = 3,       // shut down / process set removed
  kInternal = 4,      // communication failure, lost rank, library error
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;

  static Status OK() { return {}; }
  static Status Error(StatusCode c, std::string m) { return {c, std::move(m)}; }
  bool ok() const { return code == StatusCode::kOk; }
};

// A view of one buffer the core reads or writes. The owner (the Python layer,
// or the core for outputs it allocates) keeps the memory alive until the op's
// handle completes.
struct BufferDesc {
  void* data = nullptr;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  int device = kCpuDevice;

  int64_t NumElements() const;
  size_t Bytes() const { return static_cast<size_t>(NumElements()) * DataTypeSize(dtype); }
  // Elements in one slice along dim 0 (product of dims 1..n-1; 1 for scalars).
  int64_t RowElements() const;
};

std::string ShapeString(const std::vector<int64_t>& shape);
// Ranks (or any ints) for messages: "0, 2, 3", and in brackets "[0, 2, 3]".
std::string JoinInts(const std::vector<int>& v);
std::string RankListString(const std::vector<int>& v);
// "rank 1", "ranks 0 and 2", "ranks 0, 2 and 3".
std::string RanksPhrase(const std::vector<int>& ranks);
// Elements of a tensor of this shape (1 for a scalar).
int64_t ShapeElements(const std::vector<int64_t>& shape);

// Broken invariant inside the core (a bug, not a user error).
class InternalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failure reported by an external library (MPI, NCCL, CUDA, dlopen).
class LibraryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A precondition the caller violated; becomes ValueError in Python.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A dtype the op does not take (bool but Min/Max, Adasum on integers);
// TypeError in Python (also a ValueError, as in Horovod).
class UnsupportedDtype : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// A valid request that Horovod does not implement either (Adasum on a
// process set); NotImplementedError in Python (also a ValueError).
class NotSupported : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

#define HVD_STRINGIFY_INNER(x) #x
#define HVD_STRINGIFY(x) HVD_STRINGIFY_INNER(x)

// Invariant check: throws InternalError with both the text and file:line.
#define HVD_ENFORCE(cond, msg)                                                    \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::ostringstream hvd_os_;                                                 \
      hvd_os_ << "internal error: " << msg << " (check `" #cond "` failed at "     \
              << __FILE__ << ":" << __LINE__ << ")";                              \
      throw ::hvdcompat::InternalError(hvd_os_.str());                            \
    }                                                                             \
  } while (0)

// Comparison invariants print both operands, as text and as values
// ("`a == b` failed: 3 vs 4"), so the report says how far off it was.
#define HVD_ENFORCE_OP_(a, op, b, msg)                                            \
  do {                                                                            \
    const auto& hvd_a_ = (a);                                                     \
    const auto& hvd_b_ = (b);                                                     \
    if (!(hvd_a_ op hvd_b_)) {                                                    \
      std::ostringstream hvd_os_;                                                 \
      hvd_os_ << "internal error: " << msg << " (check `" #a " " #op " " #b       \
              << "` failed: " << hvd_a_ << " vs " << hvd_b_ << ", at " << __FILE__ \
              << ":" << __LINE__ << ")";                                          \
      throw ::hvdcompat::InternalError(hvd_os_.str());                            \
    }                                                                             \
  } while (0)
#define HVD_ENFORCE_EQ(a, b, msg) HVD_ENFORCE_OP_(a, ==, b, msg)
#define HVD_ENFORCE_NE(a, b, msg) HVD_ENFORCE_OP_(a, !=, b, msg)
#define HVD_ENFORCE_LT(a, b, msg) HVD_ENFORCE_OP_(a, <, b, msg)
#define HVD_ENFORCE_LE(a, b, msg) HVD_ENFORCE_OP_(a, <=, b, msg)
#define HVD_ENFORCE_GE(a, b, msg) HVD_ENFORCE_OP_(a, >=, b, msg)

}  // namespace hvdcompat
