// One NCCL communicator over the ranks of an MPI communicator: created
// collectively (the unique id travels over MPI), used for launches by the
// worker thread, polled for asynchronous errors and aborted by any thread.
#pragma once

#include <mpi.h>

#include <atomic>
#include <mutex>
#include <string>

#include "gpu/gpu_events.h"
#include "gpu/gpu_library.h"

namespace hvdcompat {

class NcclComm : public AsyncErrorSource {
 public:
  // Collective over `mpi_comm` (every member, same order): its rank 0 makes
  // the unique id, MPI broadcasts it, every rank joins on `device`.
  // `what` names the communicator in errors. Throws LibraryError.
  NcclComm(MPI_Comm mpi_comm, int device, std::string what);
  // Destroys the communicator, or leaves it when it was aborted.
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Held by the worker around its NCCL calls on this communicator so that an
  // abort from another thread never frees it mid-call (unless the call is
  // stuck, see Abort). Throws LibraryError when the communicator is gone.
  class Launch {
   public:
    explicit Launch(NcclComm& comm);
    ~Launch() = default;
    ncclComm_t get() const { return comm_->comm_; }

   private:
    NcclComm* comm_;
    std::unique_lock<std::timed_mutex> lock_;
  };

  // AsyncErrorSource: ncclCommGetAsyncError, aborting on an error.
  std::string PollAndAbortOnError() override;

  // Aborts once (later calls return at once): waits briefly for a launch in
  // progress, then aborts regardless, since ncclCommAbort is how NCCL
  // releases a call blocked on a dead peer.
  void Abort(const std::string& why);

 private:
  void AbortLocked(const std::string& why);

  const std::string what_;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  std::timed_mutex launch_mu_;
  std::mutex state_mu_;  // guards aborted_ transitions and error_
  std::atomic<bool> aborted_{false};
  std::string error_;
};

}  // namespace hvdcompat
