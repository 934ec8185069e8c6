// Hands a core-allocated buffer to Python as a DLPack capsule ("dltensor");
// torch.from_dlpack takes ownership and frees it through our deleter.
#pragma once

#include <Python.h>

#include "core/tensor_entry.h"

namespace hvdcompat {

// Consumes `buffer`. Returns a new reference.
PyObject* ToDLPackCapsule(OwnedBuffer buffer);

}  // namespace hvdcompat
