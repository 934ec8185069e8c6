// The binding's hold on the runtime. Note [Runtime lease]: every binding
// call that uses the Runtime takes a RuntimeLease first, under the lock that
// guards the runtime pointer, and keeps it until it returns, so a concurrent
// hvd.shutdown() (or elastic reset) never frees the runtime under a call that
// released the GIL. shutdown() swaps the pointer out, stops the runtime (its
// pending ops and blocking calls fail) and then waits until every lease on
// it is gone before destroying it; a call made after that meets no runtime
// and raises "Horovod has not been initialized".
#pragma once

#include <memory>

namespace hvdcompat {

class Runtime;

class RuntimeLease {
 public:
  // Throws ValueError ("not initialized") when there is no runtime.
  RuntimeLease();
  ~RuntimeLease();
  RuntimeLease(const RuntimeLease&) = delete;
  RuntimeLease& operator=(const RuntimeLease&) = delete;

  Runtime* operator->() const { return rt_.get(); }
  Runtime& operator*() const { return *rt_; }

 private:
  std::shared_ptr<Runtime> rt_;
};

}  // namespace hvdcompat
