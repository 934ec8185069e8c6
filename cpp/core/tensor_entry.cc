#include "core/tensor_entry.h"

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

OwnedBuffer OwnedBuffer::Adopt(void* data, BufferDesc desc, Deleter deleter) {
  OwnedBuffer b;
  b.data_ = data;
  b.desc_ = std::move(desc);
  b.desc_.data = data;
  b.deleter_ = std::move(deleter);
  return b;
}

void OwnedBuffer::Reset() {
  if (data_) {
    if (deleter_) {
      deleter_(data_);
    } else {
      std::free(data_);
    }
  }
  data_ = nullptr;
  desc_.data = nullptr;
  deleter_ = nullptr;
}

OwnedBuffer& OwnedBuffer::operator=(OwnedBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    data_ = o.data_;
    desc_ = std::move(o.desc_);
    deleter_ = std::move(o.deleter_);
    o.data_ = nullptr;
    o.desc_.data = nullptr;
    o.deleter_ = nullptr;
  }
  return *this;
}

std::pair<void*, OwnedBuffer::Deleter> OwnedBuffer::ReleaseWithDeleter() {
  std::pair<void*, Deleter> out{data_, std::move(deleter_)};
  data_ = nullptr;
  desc_.data = nullptr;
  deleter_ = nullptr;
  return out;
}

}  // namespace hvdcompat
