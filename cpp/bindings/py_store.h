// The Python side of the Gloo controller's binding (the contract in
// docs/launching-without-mpi.md): the store object hvd.init hands the engine,
// and the InitOptions fields that choose and configure the controller.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "transport/key_value_store.h"

namespace hvdcompat {

// A KeyValueStore calling a Python object's set(key, bytes), get(key) -> bytes,
// add(key, int) -> int and wait(keys, timeout_s), taking the GIL for each call
// (the engine calls it with the GIL released). A Python exception becomes a
// LibraryError carrying its text.
std::shared_ptr<KeyValueStore> WrapPythonStore(pybind11::object store);

// gloo_built(), gloo_enabled(), mpi_enabled() on the module.
void RegisterGlooBindings(pybind11::module_& m);

}  // namespace hvdcompat
