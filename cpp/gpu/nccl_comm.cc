#include "gpu/nccl_comm.h"

#include <chrono>

#include "gpu/gpu_check.h"
#include "logging.h"
#include "mpi_util.h"

namespace hvdcompat {

NcclComm::NcclComm(MPI_Comm mpi_comm, int device, std::string what) : what_(std::move(what)) {
  const NcclApi& nccl = Nccl();
  HVD_MPI_CHECK(mpi_comm, MPI_Comm_rank(mpi_comm, &rank_));
  HVD_MPI_CHECK(mpi_comm, MPI_Comm_size(mpi_comm, &size_));
  ncclUniqueId id{};
  // The id is made where it is broadcast from; a failure there must not
  // leave the others blocked in MPI_Bcast, so its status travels too.
  int made = 1;
  if (rank_ == 0) made = nccl.GetUniqueId(&id) == ncclSuccess ? 1 : 0;
  HVD_MPI_CHECK(mpi_comm, MPI_Bcast(&made, 1, MPI_INT, 0, mpi_comm));
  if (!made) {
    throw LibraryError(what_ + ": ncclGetUniqueId failed on the set's rank 0; see its log "
                       "(NCCL_DEBUG=WARN shows why)");
  }
  HVD_MPI_CHECK(mpi_comm, MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, mpi_comm));
  DeviceGuard guard(device);
  HVD_NCCL_CHECK(nullptr, nccl.CommInitRank(&comm_, size_, id, rank_));
}

NcclComm::~NcclComm() {
  if (aborted_.load() || !comm_) return;
  const GpuLibraries& g = Gpu();
  if (!g.nccl_ok()) return;
  ncclResult_t rc = g.nccl.CommDestroy(comm_);
  if (rc != ncclSuccess) {
    HVD_LOG(kWarning) << what_ << ": ncclCommDestroy failed: " << NcclErrorText(rc, nullptr);
  }
}

NcclComm::Launch::Launch(NcclComm& comm) : comm_(&comm), lock_(comm.launch_mu_) {
  if (comm.aborted_.load()) {
    // Abort takes state_mu_ before launch_mu_: never hold both the other way.
    lock_.unlock();
    std::lock_guard<std::mutex> state(comm.state_mu_);
    throw LibraryError(comm.what_ + " was aborted earlier (" + comm.error_ +
                       "); no further GPU collectives can run on it in this job");
  }
}

std::string NcclComm::PollAndAbortOnError() {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (aborted_.load()) return error_;
  ncclResult_t async = ncclSuccess;
  ncclResult_t rc = Nccl().CommGetAsyncError(comm_, &async);
  if (rc != ncclSuccess) {
    AbortLocked("ncclCommGetAsyncError failed: " + NcclErrorText(rc, comm_));
    return error_;
  }
  if (async == ncclSuccess || async == ncclInProgress) return "";
  AbortLocked("NCCL reported an asynchronous error: " + NcclErrorText(async, comm_));
  return error_;
}

void NcclComm::Abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(state_mu_);
  AbortLocked(why);
}

void NcclComm::AbortLocked(const std::string& why) {
  if (aborted_.load()) return;
  error_ = why + "; the " + what_ + " was aborted";
  aborted_.store(true);
  // A launch that does not return within the grace period is stuck on a
  // peer; aborting is what releases it, so go ahead without the lock.
  std::unique_lock<std::timed_mutex> launch(launch_mu_, std::defer_lock);
  if (!launch.try_lock_for(std::chrono::seconds(2))) {
    HVD_LOG(kWarning) << what_ << ": aborting while a launch is in progress";
  }
  ncclResult_t rc = Nccl().CommAbort(comm_);
  if (rc != ncclSuccess) {
    HVD_LOG(kWarning) << what_ << ": ncclCommAbort failed: " << NcclErrorText(rc, nullptr);
  }
  HVD_LOG(kError) << error_;
}

}  // namespace hvdcompat
