#include "transport/mpi_transport.h"

#include <cstring>

namespace hvdcompat {

namespace {
// The first broadcast carries the length and this many bytes; longer
// response lists need a second broadcast.
constexpr size_t kFirstChunk = 4096;
}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm, const MpiOps* ops, Poller* poller)
    : comm_(comm), ops_(ops), poller_(poller) {
  HVD_MPI_CHECK(comm_, MPI_Comm_rank(comm_, &rank_));
  HVD_MPI_CHECK(comm_, MPI_Comm_size(comm_, &size_));
}

void MpiTransport::Wait(MPI_Request* request, const char* what) {
  try {
    poller_->Wait(request, comm_, what);
  } catch (...) {
    abandoned_ = true;
    struct Abandoned {
      std::vector<uint64_t> a;
      std::vector<char> b, c, d, e;
    };
    // Intentionally never freed: MPI may still write here.
    new Abandoned{std::move(flags_), std::move(gather_send_), std::move(gather_recv_),
                  std::move(bcast_first_), std::move(bcast_rest_)};
    throw;
  }
}

void MpiTransport::CombineFlags(std::vector<uint64_t>& words) {
  flags_ = words;
  // One element of `n` words: the combiner reads the words by position, so
  // the reduction must never be split (see FlagCombineFn).
  if (flags_type_words_ != flags_.size()) {
    if (flags_type_ != MPI_DATATYPE_NULL) MPI_Type_free(&flags_type_);
    flags_type_words_ = 0;
    HVD_MPI_CHECK(comm_, MPI_Type_contiguous(static_cast<int>(flags_.size()), MPI_UINT64_T,
                                             &flags_type_));
    HVD_MPI_CHECK(comm_, MPI_Type_commit(&flags_type_));
    flags_type_words_ = flags_.size();
  }
  MPI_Request req;
  HVD_MPI_CHECK(comm_, MPI_Iallreduce(MPI_IN_PLACE, flags_.data(), 1, flags_type_,
                                      ops_->flag_combine(), comm_, &req));
  Wait(&req, "the negotiation of ready tensors (flags allreduce)");
  words.assign(flags_.begin(), flags_.end());
}

void MpiTransport::GatherBlobs(const std::string& mine, size_t max_bytes,
                               std::vector<std::string>* all) {
  const size_t slot = BlobSlotBytes(max_bytes);
  HVD_ENFORCE_LT(slot, static_cast<size_t>(INT32_MAX), "request list too large");
  FrameBlob(mine, max_bytes, &gather_send_);
  if (rank_ == 0) gather_recv_.resize(slot * static_cast<size_t>(size_));
  MPI_Request req;
  HVD_MPI_CHECK(comm_, MPI_Igather(gather_send_.data(), static_cast<int>(slot), MPI_BYTE,
                                   rank_ == 0 ? gather_recv_.data() : nullptr,
                                   static_cast<int>(slot), MPI_BYTE, 0, comm_, &req));
  Wait(&req, "the gather of new tensor requests to the coordinator");
  if (rank_ != 0) return;
  UnframeBlobs(gather_recv_, max_bytes, size_, all);
}

void MpiTransport::BroadcastBlob(std::string* blob) {
  bcast_first_.assign(kFirstChunk, 0);
  uint64_t len = rank_ == 0 ? blob->size() : 0;
  const size_t head = kFirstChunk - sizeof(len);
  if (rank_ == 0) {
    std::memcpy(bcast_first_.data(), &len, sizeof(len));
    std::memcpy(bcast_first_.data() + sizeof(len), blob->data(), std::min<size_t>(len, head));
  }
  MPI_Request req;
  HVD_MPI_CHECK(comm_, MPI_Ibcast(bcast_first_.data(), static_cast<int>(kFirstChunk), MPI_BYTE, 0,
                                  comm_, &req));
  Wait(&req, "the broadcast of negotiated responses");
  std::memcpy(&len, bcast_first_.data(), sizeof(len));
  if (rank_ != 0) blob->assign(bcast_first_.data() + sizeof(len), std::min<size_t>(len, head));
  if (len <= head) return;
  const size_t rest = len - head;
  HVD_ENFORCE_LT(rest, static_cast<size_t>(INT32_MAX), "response list too large: " << len);
  bcast_rest_.assign(rest, 0);
  if (rank_ == 0) std::memcpy(bcast_rest_.data(), blob->data() + head, rest);
  HVD_MPI_CHECK(comm_, MPI_Ibcast(bcast_rest_.data(), static_cast<int>(rest), MPI_BYTE, 0, comm_,
                                  &req));
  Wait(&req, "the broadcast of negotiated responses");
  if (rank_ != 0) blob->append(bcast_rest_.data(), rest);
}

}  // namespace hvdcompat
