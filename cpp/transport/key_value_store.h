// A rendezvous key-value store the Gloo controller connects through: the
// launch's (torchrun's TCPStore, hvdcompatrun --gloo's server), handed in by
// the Python layer (bindings/py_store.cc). Keys are the engine's own; the
// store that is passed in already prefixes them. Called only at init and
// process-set creation, from the calling thread. Failures throw
// LibraryError with the store's own message.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace hvdcompat {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual void Set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists or the store's timeout passes (then throws).
  virtual std::string Get(const std::string& key) = 0;
  // Throws when some key is still missing after `timeout`.
  virtual void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual int64_t Add(const std::string& key, int64_t amount) = 0;
  // What the store is, for error messages ("TCPStore at 10.0.0.1:29500").
  virtual std::string Describe() const = 0;
};

}  // namespace hvdcompat
