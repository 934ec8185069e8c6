#include "transport/mpi_util.h"

#include "transport/request_wait.h"

// Open MPI declares its extensions (ULFM's MPIX_*) in mpi-ext.h; the MPICH
// family has no such header and declares its MPIX_* in mpi.h.
#if defined(OPEN_MPI)
#include <mpi-ext.h>
#endif

#include <chrono>
#include <sstream>
#include <thread>


namespace hvdcompat {

std::vector<int> FailedRanks(MPI_Comm comm, int error_code) {
  std::vector<int> ranks;
#if defined(MPIX_ERR_PROC_FAILED) && defined(OMPI_HAVE_MPIX_COMM_GET_FAILED)
  int cls = 0;
  MPI_Error_class(error_code, &cls);
  if (comm == MPI_COMM_NULL || (cls != MPIX_ERR_PROC_FAILED && cls != MPIX_ERR_REVOKED &&
                                cls != MPIX_ERR_PROC_FAILED_PENDING)) {
    return ranks;
  }
  MPI_Group failed = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
  if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return ranks;
  int n = 0;
  MPI_Group_size(failed, &n);
  // A peer's revoke can arrive before the news of the failure that caused it;
  // wait for that news (briefly) so the error can name who failed.
  for (int tries = 0; n == 0 && cls == MPIX_ERR_REVOKED && tries < 250; ++tries) {
    MPI_Group_free(&failed);
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);  // progress
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return ranks;
    MPI_Group_size(failed, &n);
  }
  if (n > 0 && MPI_Comm_group(comm, &all) == MPI_SUCCESS) {
    std::vector<int> in(n), out(n);
    for (int i = 0; i < n; ++i) in[i] = i;
    MPI_Group_translate_ranks(failed, n, in.data(), all, out.data());
    for (int r : out) {
      if (r != MPI_UNDEFINED) ranks.push_back(r);
    }
    MPI_Group_free(&all);
  }
  MPI_Group_free(&failed);
  // Make every survivor's pending operation on this communicator fail too,
  // instead of waiting for a peer that will never come.
  MPIX_Comm_revoke(comm);
#else
  (void)comm;
  (void)error_code;
#endif
  return ranks;
}

std::vector<int> KnownFailures(MPI_Comm comm) {
#if defined(MPIX_ERR_PROC_FAILED) && defined(OMPI_HAVE_MPIX_COMM_GET_FAILED)
  if (comm == MPI_COMM_NULL) return {};
  MPI_Group failed = MPI_GROUP_NULL;
  if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return {};
  int n = 0;
  MPI_Group_size(failed, &n);
  MPI_Group_free(&failed);
  if (n == 0) return {};
  return FailedRanks(comm, MPIX_ERR_PROC_FAILED);
#else
  (void)comm;
  return {};
#endif
}

void ThrowMpiError(int rc, const char* call, MPI_Comm comm, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  std::ostringstream os;
  os << "MPI call " << call << " failed: " << std::string(text, len) << " (error code " << rc
     << ", " << file << ":" << line << ")";
  throw CommunicationError(os.str(), FailedRanks(comm, rc));
}

std::vector<int64_t> ExchangeAlltoallRows(MPI_Comm comm, const std::vector<int64_t>& send_rows) {
  int size = 0;
  HVD_MPI_CHECK(comm, MPI_Comm_size(comm, &size));
  HVD_ENFORCE_EQ(static_cast<int>(send_rows.size()), size, "alltoall splits size");
  std::vector<int64_t> recv_rows(size);
  HVD_MPI_CHECK(comm, MPI_Alltoall(send_rows.data(), 1, MPI_INT64_T, recv_rows.data(), 1,
                                   MPI_INT64_T, comm));
  return recv_rows;
}

std::vector<int64_t> ExchangeAlltoallRows(MPI_Comm comm, const std::vector<int64_t>& send_rows,
                                          const WaitPolicy& wait) {
  int size = 0;
  HVD_MPI_CHECK(comm, MPI_Comm_size(comm, &size));
  HVD_ENFORCE(static_cast<int>(send_rows.size()) == size, "alltoall splits size");
  std::vector<int64_t> recv_rows(size);
  MPI_Request req;
  HVD_MPI_CHECK(comm, MPI_Ialltoall(send_rows.data(), 1, MPI_INT64_T, recv_rows.data(), 1,
                                    MPI_INT64_T, comm, &req));
  WaitRequest(&req, comm, wait, "alltoall of row counts");
  return recv_rows;
}

namespace {

// The cycle words travel as one element of a contiguous type (see
// MpiTransport::CombineFlags), so an algorithm that splits the vector
// (Open MPI's ring) never hands this function part of the layout.
void FlagCombineFn(void* in, void* inout, int* len, MPI_Datatype* type) {
  int bytes = 0;
  MPI_Type_size(*type, &bytes);
  const size_t words = static_cast<size_t>(*len) * static_cast<size_t>(bytes) / sizeof(uint64_t);
  FlagWords::Combine(static_cast<uint64_t*>(inout), static_cast<const uint64_t*>(in), words);
}

}  // namespace

MpiOps::MpiOps() {
  HVD_MPI_CHECK(MPI_COMM_NULL, MPI_Op_create(&FlagCombineFn, 1, &flag_combine_));
}

const MpiOps& MpiOps::Get() {
  static const MpiOps* ops = new MpiOps();  // see the class comment: never freed
  return *ops;
}

MPI_Datatype MpiOps::Type(DataType dtype) const {
  switch (dtype) {
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kBool: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16: return MPI_UINT16_T;
    case DataType::kBFloat16: return MPI_UINT16_T;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
  }
  throw InternalError("no MPI type for dtype");
}

MPI_Op MpiOps::Op(ReduceOp op) const {
  switch (op) {
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    default: return MPI_SUM;
  }
}

}  // namespace hvdcompat
