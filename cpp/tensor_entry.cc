#include "tensor_entry.h"

#include <new>

namespace hvdcompat {

OwnedBuffer OwnedBuffer::Allocate(DataType dtype, Shape shape) {
  OwnedBuffer b;
  b.desc_.dtype = dtype;
  b.desc_.shape = std::move(shape);
  size_t bytes = b.desc_.Bytes();
  // 64-byte alignment for vector loads; never a zero-size allocation.
  size_t rounded = ((bytes + 63) / 64) * 64;
  if (rounded == 0) rounded = 64;
  b.data_ = std::aligned_alloc(64, rounded);
  if (!b.data_) throw std::bad_alloc();
  b.desc_.data = b.data_;
  return b;
}

OwnedBuffer& OwnedBuffer::operator=(OwnedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = o.data_;
    desc_ = std::move(o.desc_);
    o.data_ = nullptr;
    o.desc_.data = nullptr;
  }
  return *this;
}

void* OwnedBuffer::Release() {
  void* p = data_;
  data_ = nullptr;
  desc_.data = nullptr;
  return p;
}

}  // namespace hvdcompat
