#include "gpu/nccl_comm.h"

#include <chrono>
#include <map>

#include "gpu/gpu_check.h"
#include "core/logging.h"
#include "transport/mpi_util.h"

namespace hvdcompat {

std::timed_mutex& DeviceLaunchMutex(int device) {
  // Never destroyed: communicators may be released during process exit.
  static auto* mu = new std::mutex();
  static auto* locks = new std::map<int, std::timed_mutex>();
  std::lock_guard<std::mutex> lock(*mu);
  return (*locks)[device];  // std::map never moves its elements
}

NcclComm::NcclComm(MPI_Comm mpi_comm, int device, std::string what)
    : what_(std::move(what)), device_(device) {
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
  if (!comm_) return;
  const GpuLibraries& g = Gpu();
  if (!g.nccl_ok()) return;
  // No launch can be in progress: the owner (the worker) is destroying us.
  std::lock_guard<std::timed_mutex> device(DeviceLaunchMutex(device_));
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return;
  if (abort_requested_) {
    AbortNowLocked();
    return;
  }
  ncclResult_t rc = g.nccl.CommDestroy(comm_);
  if (rc != ncclSuccess) {
    HVD_LOG(kWarning) << what_ << ": ncclCommDestroy failed: " << NcclErrorText(rc, nullptr);
  }
}

NcclComm::Launch::Launch(NcclComm& comm)
    : device_lock_(DeviceLaunchMutex(comm.device_)), comm_(&comm) {
  std::lock_guard<std::mutex> lock(comm.mu_);
  if (comm.abort_requested_) {
    if (!comm.aborted_) comm.AbortNowLocked();  // deferred by Abort; nobody is inside now
    throw LibraryError(comm.what_ + " was aborted earlier (" + comm.error_ +
                       "); no further GPU collectives can run on it in this job");
  }
  comm.in_launch_ = true;
}

NcclComm::Launch::~Launch() {
  std::lock_guard<std::mutex> lock(comm_->mu_);
  comm_->in_launch_ = false;
  // An abort requested while this launch was inside NCCL happens now.
  if (comm_->abort_requested_ && !comm_->aborted_) comm_->AbortNowLocked();
}

std::string NcclComm::PollAndAbortOnError() {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_requested_) return error_;
    ncclResult_t async = ncclSuccess;
    ncclResult_t rc = Nccl().CommGetAsyncError(comm_, &async);
    if (rc != ncclSuccess) {
      why = "ncclCommGetAsyncError failed: " + NcclErrorText(rc, comm_);
    } else if (async != ncclSuccess && async != ncclInProgress) {
      why = "NCCL reported an asynchronous error: " + NcclErrorText(async, comm_);
    } else {
      return "";
    }
  }
  Abort(why);
  return ErrorIfAborted();
}

std::string NcclComm::ErrorIfAborted() {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_requested_ ? error_ : std::string();
}

void NcclComm::Abort(const std::string& why) { AbortAs(why, false); }

void NcclComm::Release(const std::string& why) { AbortAs(why, true); }

void NcclComm::AbortAs(const std::string& why, bool expected) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_requested_) return;
    abort_requested_ = true;
    error_ = why + "; the " + what_ + " was aborted";
  }
  if (expected) {
    HVD_LOG(kInfo) << why << "; aborting the " << what_;
  } else {
    HVD_LOG(kError) << why << "; aborting the " << what_;
  }
  // No call on any communicator of this device may overlap the abort.
  std::unique_lock<std::timed_mutex> device(DeviceLaunchMutex(device_), std::defer_lock);
  if (!device.try_lock_for(std::chrono::seconds(kAbortGraceSeconds))) {
    HVD_LOG(kWarning) << what_ << ": a launch on cuda:" << device_ << " has not returned within "
                      << kAbortGraceSeconds << " s; the abort happens when it does (if it "
                      << "never does, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS ends the job)";
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_) AbortNowLocked();
}

void NcclComm::AbortNowLocked() {
  aborted_ = true;
  ncclResult_t rc = Nccl().CommAbort(comm_);
  if (rc != ncclSuccess) {
    HVD_LOG(kWarning) << what_ << ": ncclCommAbort failed: " << NcclErrorText(rc, nullptr);
  }
}

}  // namespace hvdcompat
