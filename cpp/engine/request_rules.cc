// The rules a request must meet before it is enqueued (Runtime's checks of
// the caller's arguments): devices and dtypes of the buffers, what each op
// reduces, the broadcast root and alltoall's splits. Each rule is written
// here once; the Python layer checks only what is about torch.
#include <algorithm>

#include "core/checked_math.h"
#include "engine/runtime.h"

namespace hvdcompat {

void Runtime::CheckReduction(const std::string& op, const std::string& name, int process_set,
                             ReduceOp reduce_op, std::optional<DataType> dtype) const {
  if (reduce_op == ReduceOp::kAdasum) {
    if (process_set > 0) {
      std::string set = "process set " + std::to_string(process_set);
      {
        std::lock_guard<std::mutex> lock(sets_mu_);
        auto it = set_ranks_.find(process_set);
        set = it != set_ranks_.end() ? DescribeSet(process_set, it->second)
                                     : set + " (not registered)";
      }
      throw NotSupported(Subject(op, name) + ": Adasum does not support non-global process sets "
                         "(got " + set + "). Run op=hvd.Adasum on hvd.global_process_set, or use "
                         "op=hvd.Average / hvd.Sum on this set.");
    }
    if (dtype && !IsFloatingPoint(*dtype)) {
      throw UnsupportedDtype(Subject(op, name) + ": op=hvd.Adasum reduces float16, bfloat16, "
                             "float32 and float64 tensors, not " + DataTypeName(*dtype) +
                             ". Cast the tensor to a floating dtype (e.g. tensor.float()) or use "
                             "op=hvd.Sum / hvd.Average.");
    }
  }
  if (dtype == DataType::kBool && reduce_op != ReduceOp::kMin && reduce_op != ReduceOp::kMax) {
    throw UnsupportedDtype(Subject(op, name) + ": bool tensors reduce only with op=hvd.Min "
                           "(logical and) or op=hvd.Max (logical or), not " +
                           ReduceOpName(reduce_op) + ". Cast to an integer dtype to count.");
  }
}

Request Runtime::DescribeRequest(const EnqueueArgs& args) const {
  Request q;
  q.op = args.op;
  q.name = args.name;
  q.auto_named = args.auto_named;
  q.reduce_op = args.reduce_op;
  q.prescale = args.prescale;
  q.postscale = args.postscale;
  q.device = args.inputs.empty() ? kCpuDevice : args.inputs[0].device;
  q.dtype = args.inputs.empty() ? DataType::kUInt8 : args.inputs[0].dtype;
  const std::string op = OpTypeName(args.op);
  for (const auto& b : args.inputs) {
    if (b.device != q.device) {
      throw InvalidArgument(Subject(op, q.name) + ": Tensors in list must be on same device "
                            "(found " + std::to_string(q.device) + " and " +
                            std::to_string(b.device) + "). Move them to one device.");
    }
    if (b.dtype != q.dtype) {
      throw InvalidArgument(Subject(op, q.name) + ": tensors in a group must share one dtype "
                            "(found " + DataTypeName(q.dtype) + " and " + DataTypeName(b.dtype) +
                            "). Cast them to one dtype.");
    }
    if (args.op == OpType::kAllgather && b.shape.empty()) {
      throw InvalidArgument(Subject(op, q.name) + ": cannot allgather a scalar (0-dim) tensor; "
                            "reshape it to [1] first.");
    }
    q.shapes.push_back(b.shape);
  }
  if (args.op == OpType::kAllreduce || args.op == OpType::kReducescatter) {
    CheckReduction(op, q.name, args.process_set, q.reduce_op,
                   args.inputs.empty() ? std::nullopt : std::optional<DataType>(q.dtype));
  }
  for (const auto& b : args.outputs) {
    if (b.device != q.device) {
      throw InvalidArgument(Subject(op, q.name) + ": outputs must be on the inputs' device "
                            "(found " + std::to_string(q.device) + " and " +
                            std::to_string(b.device) + ")");
    }
  }
  return q;
}

int Runtime::SetRoot(const ProcessSetWorker& worker, const EnqueueArgs& args) const {
  const auto& ranks = worker.global_ranks();
  auto it = std::find(ranks.begin(), ranks.end(), args.root);
  if (it == ranks.end()) {
    throw InvalidArgument(Subject(OpTypeName(args.op), args.name) + ": invalid root rank " +
                          std::to_string(args.root) + ": it is not a member of " +
                          DescribeSet(worker.id(), ranks) +
                          ". root_rank is a global rank; pass one of the set's ranks.");
  }
  return static_cast<int>(it - ranks.begin());
}

void Runtime::ResolveSplits(const ProcessSetWorker& worker, EnqueueArgs* args) const {
  const std::string subject = Subject(OpTypeName(args->op), args->name);
  HVD_ENFORCE(args->inputs.size() == 1, "alltoall with " << args->inputs.size() << " inputs");
  const Shape& shape = args->inputs[0].shape;
  if (shape.empty()) {
    throw InvalidArgument(subject + ": cannot alltoall a scalar (0-dim) tensor; reshape it to "
                          "[1] first.");
  }
  const int64_t rows = shape[0];
  const int64_t n = worker.size();
  const std::string workers = std::to_string(n) + " ranks in " +
                              DescribeSet(worker.id(), worker.global_ranks());
  if (args->splits.empty()) {
    if (rows % n) {
      throw InvalidArgument(subject + ": splits not provided, but first dimension of tensor is "
                            "not an even multiple of the number of workers (" +
                            std::to_string(rows) + " rows, " + workers +
                            "). Pass splits=[rows for each rank].");
    }
    args->splits.assign(1, std::vector<int64_t>(n, rows / n));
    return;
  }
  HVD_ENFORCE(args->splits.size() == 1, "alltoall with " << args->splits.size() << " split lists");
  const std::vector<int64_t>& splits = args->splits[0];
  std::string listed = "[";
  for (size_t i = 0; i < splits.size() && i < 16; ++i) {
    listed += (i ? ", " : "") + std::to_string(splits[i]);
  }
  listed += splits.size() > 16 ? ", ...]" : "]";
  if (static_cast<int64_t>(splits.size()) != n) {
    throw InvalidArgument(subject + ": Number of entries in splits (" +
                          std::to_string(splits.size()) + ") does not equal number of workers (" +
                          workers + "). Pass one entry per rank of the set.");
  }
  // Each entry is checked against the rows before any is added: a sum of
  // huge entries could wrap around to a value that passes the sum check.
  for (int64_t v : splits) {
    if (v < 0) {
      throw InvalidArgument(subject + ": splits must be non-negative, got " + listed + ".");
    }
    if (v > rows) {
      throw InvalidArgument(subject + ": splits entry " + std::to_string(v) +
                            " is greater than the first dimension of tensor (" +
                            std::to_string(rows) + "). splits " + listed +
                            " counts the rows sent to each rank.");
    }
  }
  const int64_t sum = CheckedSum(splits, (subject + ": sum of splits " + listed).c_str());
  if (sum > rows) {
    throw InvalidArgument(subject + ": Sum of splits entries (" + std::to_string(sum) +
                          ") is greater than the first dimension of tensor (" +
                          std::to_string(rows) + "). splits " + listed +
                          " counts the rows sent to each rank.");
  }
}

}  // namespace hvdcompat
