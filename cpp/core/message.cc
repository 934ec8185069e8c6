#include "core/message.h"

#include <cstring>

#include "core/checked_math.h"

namespace hvdcompat {

int64_t Request::TotalBytes() const {
  int64_t n = 0;
  for (const auto& s : shapes) n = CheckedAdd(n, ShapeElements(s), "elements of a request");
  return CheckedMul(n, static_cast<int64_t>(DataTypeSize(dtype)), "bytes of a request");
}

int64_t Response::TotalElements() const {
  int64_t n = 0;
  for (const auto& u : units) {
    for (const auto& s : u.shapes) n = CheckedAdd(n, ShapeElements(s), "elements of a response");
  }
  return n;
}

namespace {

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  void PutShapes(const std::vector<Shape>& shapes) {
    Put<uint32_t>(static_cast<uint32_t>(shapes.size()));
    for (const auto& s : shapes) {
      Put<uint8_t>(static_cast<uint8_t>(s.size()));
      for (int64_t d : s) Put<int64_t>(d);
    }
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), end_(data + size) {}
  template <typename T>
  T Get() {
    Need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string GetString() {
    uint32_t n = Get<uint32_t>();
    Need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  std::vector<Shape> GetShapes() {
    uint32_t n = Get<uint32_t>();
    std::vector<Shape> shapes(n);
    for (auto& s : shapes) {
      uint8_t dims = Get<uint8_t>();
      s.resize(dims);
      for (auto& d : s) d = Get<int64_t>();
    }
    return shapes;
  }
  bool AtEnd() const { return p_ == end_; }

 private:
  void Need(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) {
      throw InternalError("truncated control message: needed " + std::to_string(n) +
                          " more bytes; ranks may be running different hvdcompat versions");
    }
  }
  const char* p_;
  const char* end_;
};

void PutHeader(Writer& w, OpType op, DataType dtype, ReduceOp reduce_op, int32_t root,
               int32_t device, double prescale, double postscale) {
  w.Put<uint8_t>(static_cast<uint8_t>(op));
  w.Put<uint8_t>(static_cast<uint8_t>(dtype));
  w.Put<uint8_t>(static_cast<uint8_t>(reduce_op));
  w.Put<int32_t>(root);
  w.Put<int32_t>(device);
  w.Put<double>(prescale);
  w.Put<double>(postscale);
}

template <typename T>
void GetHeader(Reader& r, T& m) {
  m.op = static_cast<OpType>(r.Get<uint8_t>());
  m.dtype = static_cast<DataType>(r.Get<uint8_t>());
  m.reduce_op = static_cast<ReduceOp>(r.Get<uint8_t>());
  m.root = r.Get<int32_t>();
  m.device = r.Get<int32_t>();
  m.prescale = r.Get<double>();
  m.postscale = r.Get<double>();
}

}  // namespace

std::string EncodeRequests(const std::vector<Request>& requests) {
  Writer w;
  w.Put<uint32_t>(static_cast<uint32_t>(requests.size()));
  for (const auto& q : requests) {
    w.Put<int32_t>(q.rank);
    PutHeader(w, q.op, q.dtype, q.reduce_op, q.root, q.device, q.prescale, q.postscale);
    w.PutString(q.name);
    w.Put<uint8_t>(q.auto_named ? 1 : 0);
    w.PutShapes(q.shapes);
  }
  return w.Take();
}

std::vector<Request> DecodeRequests(const char* data, size_t size) {
  Reader r(data, size);
  std::vector<Request> out(r.Get<uint32_t>());
  for (auto& q : out) {
    q.rank = r.Get<int32_t>();
    GetHeader(r, q);
    q.name = r.GetString();
    q.auto_named = r.Get<uint8_t>() != 0;
    q.shapes = r.GetShapes();
  }
  return out;
}

std::string EncodeResponses(const std::vector<Response>& responses) {
  Writer w;
  w.Put<uint32_t>(static_cast<uint32_t>(responses.size()));
  for (const auto& p : responses) {
    PutHeader(w, p.op, p.dtype, p.reduce_op, p.root, p.device, p.prescale, p.postscale);
    w.Put<uint32_t>(static_cast<uint32_t>(p.units.size()));
    for (const auto& u : p.units) {
      w.PutString(u.name);
      w.PutShapes(u.shapes);
    }
    w.Put<uint8_t>(p.auto_named ? 1 : 0);
    w.PutString(p.error);
    w.Put<int32_t>(static_cast<int32_t>(p.error_code));
    w.Put<int32_t>(p.last_joined);
  }
  return w.Take();
}

std::vector<Response> DecodeResponses(const char* data, size_t size) {
  Reader r(data, size);
  std::vector<Response> out(r.Get<uint32_t>());
  for (auto& p : out) {
    GetHeader(r, p);
    p.units.resize(r.Get<uint32_t>());
    for (auto& u : p.units) {
      u.name = r.GetString();
      u.shapes = r.GetShapes();
    }
    p.auto_named = r.Get<uint8_t>() != 0;
    p.error = r.GetString();
    p.error_code = static_cast<StatusCode>(r.Get<int32_t>());
    p.last_joined = r.Get<int32_t>();
  }
  return out;
}

}  // namespace hvdcompat
