#include "ops/gpu_adasum_peers.h"

#include <cstring>

#include "gloo/common/error.h"
#include "transport/mpi_util.h"

namespace hvdcompat {

namespace {

// Gloo slot prefixes of the set's context: the backend's reduce-scatter 0x40,
// host Adasum 0x41, the hierarchical steps 0x42 (ops/gloo_ops.cc); GPU
// Adasum's cross-node step takes its own.
constexpr uint8_t kGpuAdasumSlotPrefix = 0x43;

}  // namespace

MpiNodeAdasumPeers::MpiNodeAdasumPeers(MPI_Comm comm, const NodeGroups& groups) {
  int rank = 0;
  HVD_MPI_CHECK(comm, MPI_Comm_rank(comm, &rank));
  HVD_MPI_CHECK(comm, MPI_Comm_split(comm, groups.local.front(), rank, &local_));
  HVD_MPI_CHECK(comm, MPI_Comm_split(comm, groups.local_rank, rank, &cross_));
  peers_ = std::make_unique<MpiAdasumPeers>(cross_,
                                            groups.local.size() > 1 ? local_ : MPI_COMM_NULL);
}

MpiNodeAdasumPeers::~MpiNodeAdasumPeers() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&local_, &cross_}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
}

GlooNodeAdasumPeers::GlooNodeAdasumPeers(std::shared_ptr<gloo::Context> context,
                                         const NodeGroups& groups)
    : peers_(std::move(context), kGpuAdasumSlotPrefix),
      local_(groups.local),
      cross_(groups.cross),
      local_rank_(groups.local_rank),
      cross_rank_(groups.cross_rank) {}

void GlooNodeAdasumPeers::Exchange(const void* send, int64_t send_bytes, void* recv,
                                   int64_t recv_bytes, int peer) {
  try {
    peers_.SendRecv(send, static_cast<size_t>(send_bytes), cross_[peer], recv,
                    static_cast<size_t>(recv_bytes), cross_[peer]);
  } catch (const gloo::Exception& e) {
    throw CommunicationError(std::string("Gloo: GPU Adasum's exchange with set rank ") +
                             std::to_string(cross_[peer]) + " failed: " + e.what() +
                             " (a peer may have exited; its own output says why)");
  }
}

void GlooNodeAdasumPeers::SumOverShards(double* values, int n) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(double);
  all_.assign(local_.size() * static_cast<size_t>(n), 0.0);
  std::memcpy(all_.data() + static_cast<size_t>(local_rank_) * n, values, bytes);
  try {
    for (size_t i = 0; i < local_.size(); ++i) {
      if (static_cast<int>(i) == local_rank_) continue;
      peers_.PostSend(values, bytes, local_[i]);
      peers_.PostRecv(all_.data() + i * n, bytes, local_[i]);
    }
    peers_.Wait();
  } catch (const gloo::Exception& e) {
    throw CommunicationError(std::string("Gloo: GPU Adasum's sum of dot products over the "
                                         "node failed: ") + e.what() +
                             " (a peer may have exited; its own output says why)");
  }
  for (int j = 0; j < n; ++j) {
    double sum = 0.0;
    for (size_t i = 0; i < local_.size(); ++i) sum += all_[i * n + j];
    values[j] = sum;
  }
}

}  // namespace hvdcompat
