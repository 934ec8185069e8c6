// One NCCL communicator over a group of a process set's ranks: created
// collectively (the unique id travels over the set's channel, MPI or Gloo:
// Note [NCCL bootstrap without MPI]), used for launches by the worker
// thread, polled for asynchronous errors and aborted by any thread. See
// Note [NCCL calls from several threads].
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "gpu/gpu_events.h"
#include "gpu/gpu_library.h"
#include "transport/set_channel.h"

namespace hvdcompat {

// Note [NCCL bootstrap without MPI]
// Every member of an NCCL communicator calls ncclCommInitRank with the same
// ncclUniqueId, which one member makes with ncclGetUniqueId; carrying those
// 128 bytes to the others is the caller's job. The engine makes its
// communicators lazily, on the set's worker thread, when the set's first
// CUDA response runs (Note [NCCL lanes]): only then is the device known
// (after the script's torch.cuda.set_device), and a job that never
// reduces a CUDA tensor never makes one. So the id travels over what that
// worker already owns: the set's SetChannel (transport/set_channel.h), which
// is the set's MPI communicator on the MPI controller and the set's Gloo
// context (TCP pairs connected at init through the launch's store) on the
// Gloo controller, where no MPI is initialised at all. It does not travel
// through the launch's store itself: that store is a Python object, which
// the engine calls only from an API thread (init, process-set creation,
// the elastic reset), taking the GIL for each call (bindings/py_store.cc),
// and engine threads never take the GIL. Making the communicators eagerly at
// init, where the store could be used, would need the device before the
// script chose it.
//
// One exchange serves every communicator of one kind: the set's ranks form
// groups (the whole set; each node's ranks; the ranks of one local rank
// across nodes), the lowest set rank of each group (its leader) makes the
// group's id, and one allgather over the set's channel carries every
// rank's (made, id) pair; each rank then joins with its leader's id. The
// allgather also carries a leader's failure in ncclGetUniqueId, so that no
// member waits for an id that never comes. An elastic reset aborts the old
// world's communicators (Release) and the new world's first CUDA response
// makes new ones, from new ids, over the new set's channel.

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

  // Joins the communicator of `id` as `rank` of `size` on `device`
  // (ncclCommInitRank: blocks until every member joined). `what` names the
  // communicator in errors. Throws LibraryError. MakeNcclComm below gets
  // the id to every member first.
  NcclComm(const ncclUniqueId& id, int rank, int size, int device, std::string what);
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

// Collective over `channel`'s set (every rank, in the same order): makes
// the communicator of this rank's group, whose leader (lowest set rank) is
// `leader` and in which this rank is `group_rank` of `group_size`, on
// `device` (Note [NCCL bootstrap without MPI]). Throws LibraryError, or
// CommunicationError when the channel fails.
std::shared_ptr<NcclComm> MakeNcclComm(SetChannel& channel, int leader, int group_rank,
                                       int group_size, int device, const std::string& what);

// The launch lock of `device` (process-wide).
std::timed_mutex& DeviceLaunchMutex(int device);

}  // namespace hvdcompat
