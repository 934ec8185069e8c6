#include "gpu/nccl_comm.h"

#include <chrono>
#include <map>
#include <vector>

#include "gpu/gpu_check.h"
#include "core/logging.h"

namespace hvdcompat {

std::timed_mutex& DeviceLaunchMutex(int device) {
  // Never destroyed: communicators may be released during process exit.
  static auto* mu = new std::mutex();
  static auto* locks = new std::map<int, std::timed_mutex>();
  std::lock_guard<std::mutex> lock(*mu);
  return (*locks)[device];  // std::map never moves its elements
}

NcclComm::NcclComm(const ncclUniqueId& id, int rank, int size, int device, std::string what)
    : what_(std::move(what)), device_(device), rank_(rank), size_(size) {
  DeviceGuard guard(device);
  HVD_NCCL_CHECK(nullptr, Nccl().CommInitRank(&comm_, size_, id, rank_));
}

std::shared_ptr<NcclComm> MakeNcclComm(SetChannel& channel, int leader, int group_rank,
                                       int group_size, int device, const std::string& what) {
  struct Slot {
    int32_t made;  // 1: this rank leads a group and made its id
    ncclUniqueId id;
  };
  const int me = channel.rank();
  Slot mine{};
  if (me == leader) mine.made = Nccl().GetUniqueId(&mine.id) == ncclSuccess ? 1 : -1;
  std::vector<Slot> all(channel.size());
  channel.AllgatherFixed(&mine, sizeof(Slot), all.data());
  if (all[leader].made != 1) {
    throw LibraryError(what + " on set rank " + std::to_string(me) + ": " +
                       (all[leader].made == 0
                            ? "set rank " + std::to_string(leader) + " did not make its id"
                            : "ncclGetUniqueId failed on set rank " + std::to_string(leader) +
                                  "; see that rank's log (NCCL_DEBUG=WARN shows why)"));
  }
  return std::make_shared<NcclComm>(all[leader].id, group_rank, group_size, device, what);
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
