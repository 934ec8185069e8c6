#include "bindings/dlpack_export.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "dlpack/dlpack.h"

namespace hvdcompat {

namespace {

struct Holder {
  DLManagedTensor managed;
  std::vector<int64_t> shape;
  void* data;
  OwnedBuffer::Deleter free_data;  // empty: std::free (host memory)
};

void Deleter(DLManagedTensor* self) {
  Holder* h = static_cast<Holder*>(self->manager_ctx);
  if (h->free_data) {
    h->free_data(h->data);
  } else {
    std::free(h->data);
  }
  delete h;
}

void CapsuleDestructor(PyObject* capsule) {
  // Only a capsule nobody consumed still owns its tensor.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (m && m->deleter) m->deleter(m);
  }
}

DLDataType ToDL(DataType t) {
  switch (t) {
    case DataType::kUInt8: return {kDLUInt, 8, 1};
    case DataType::kInt8: return {kDLInt, 8, 1};
    case DataType::kInt16: return {kDLInt, 16, 1};
    case DataType::kInt32: return {kDLInt, 32, 1};
    case DataType::kInt64: return {kDLInt, 64, 1};
    case DataType::kFloat16: return {kDLFloat, 16, 1};
    case DataType::kBFloat16: return {kDLBfloat, 16, 1};
    case DataType::kFloat32: return {kDLFloat, 32, 1};
    case DataType::kFloat64: return {kDLFloat, 64, 1};
    case DataType::kBool: return {kDLBool, 8, 1};
  }
  return {kDLUInt, 8, 1};
}

}  // namespace

PyObject* ToDLPackCapsule(OwnedBuffer buffer) {
  auto* h = new Holder();
  h->shape = buffer.desc().shape;
  DLTensor& t = h->managed.dl_tensor;
  const int device = buffer.desc().device;
  t.device = device == kCpuDevice ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, device};
  t.ndim = static_cast<int32_t>(h->shape.size());
  t.dtype = ToDL(buffer.desc().dtype);
  t.shape = h->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  auto released = buffer.ReleaseWithDeleter();
  h->data = released.first;
  h->free_data = std::move(released.second);
  t.data = h->data;
  h->managed.manager_ctx = h;
  h->managed.deleter = &Deleter;
  PyObject* capsule = PyCapsule_New(&h->managed, "dltensor", &CapsuleDestructor);
  if (!capsule) Deleter(&h->managed);
  return capsule;
}

}  // namespace hvdcompat
