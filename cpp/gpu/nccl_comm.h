// One NCCL communicator over the ranks of an MPI communicator: created
// collectively (the unique id travels over MPI), used for launches by the
// worker thread, polled for asynchronous errors and aborted by any thread.
// See Note [NCCL calls from several threads].
#pragma once

#include <mpi.h>

#include <atomic>
#include <mutex>
#include <string>

#include "gpu/gpu_events.h"
#include "gpu/gpu_library.h"

namespace hvdcompat {

// Note [NCCL calls from several threads]
// Each process set has its own worker thread and its own communicators, and
// NCCL does not allow calls on independent communicators of one device from
// several threads at once (they may hang). So every launch (the calls between
// taking a Launch and dropping it, group start to group end) holds the
// device's launch lock: launches on one device are serialised across process
// sets, while lanes (HOROVOD_NUM_NCCL_STREAMS) of one set, which the same
// worker drives, are unaffected. ncclCommGetAsyncError is the one call NCCL
// allows concurrently with others, so polling needs no launch lock.
//
// ncclCommAbort must not run while another thread is inside a call on the
// communicator. Abort therefore takes the device's launch lock (waiting up to
// kAbortGraceSeconds for a launch in progress); when a launch does not return
// in that time, the abort is left to that launch, which performs it as it
// ends. Either way the error is recorded at once, so waiters fail promptly.
// Communicator creation is collective and may block on peers, so it does not
// hold the launch lock (two sets initialising in different orders on two
// ranks would otherwise deadlock); creation happens before a set's first
// launch, on the set's own worker.
class NcclComm : public AsyncErrorSource {
 public:
  static constexpr int kAbortGraceSeconds = 2;

  // Collective over `mpi_comm` (every member, same order): its rank 0 makes
  // the unique id, MPI broadcasts it, every rank joins on `device`.
  // `what` names the communicator in errors. Throws LibraryError.
  NcclComm(MPI_Comm mpi_comm, int device, std::string what);
  // Destroys the communicator, or aborts it when an abort is still pending.
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Held by the worker around its NCCL calls on this communicator: the
  // device's launch lock, and a mark that a call is in progress. Throws
  // LibraryError when the communicator was aborted.
  class Launch {
   public:
    explicit Launch(NcclComm& comm);
    ~Launch();
    Launch(const Launch&) = delete;
    Launch& operator=(const Launch&) = delete;
    ncclComm_t get() const { return comm_->comm_; }

   private:
    std::unique_lock<std::timed_mutex> device_lock_;  // released last
    NcclComm* comm_;
  };

  // AsyncErrorSource: ncclCommGetAsyncError, aborting on an error.
  std::string PollAndAbortOnError() override;
  // Aborts once (later calls return at once); see the note for the order.
  void Abort(const std::string& why) override;
  // The same abort when the job is rebuilt without some peers (an elastic
  // reset): ncclCommAbort, which frees the communicator without waiting on
  // peers, where ncclCommDestroy may wait forever on a dead one. Logged as
  // the expected step it is, not as an error.
  void Release(const std::string& why);
  std::string ErrorIfAborted() override;

 private:
  // Caller holds mu_ and no launch on this communicator is in progress.
  void AbortNowLocked();
  // `expected`: a reset, logged as info; otherwise a failure, logged as an error.
  void AbortAs(const std::string& why, bool expected);

  const std::string what_;
  const int device_;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  std::mutex mu_;  // guards the fields below and every call on comm_ but launches
  bool in_launch_ = false;
  bool abort_requested_ = false;
  bool aborted_ = false;  // ncclCommAbort ran
  std::string error_;
};

// The launch lock of `device` (process-wide).
std::timed_mutex& DeviceLaunchMutex(int device);

}  // namespace hvdcompat
