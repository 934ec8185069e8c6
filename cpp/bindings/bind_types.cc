// The bound types of the core: its enums (DType, Op, ReduceOp, Status), its
// error classes, the argument classes calls take (Buffer, EnqueueArgs,
// InitOptions) and wait()'s result.
#include "bindings/bind_types.h"

#include <pybind11/stl.h>

#include <utility>

#include "bindings/py_store.h"
#include "core/checked_math.h"
#include "engine/runtime.h"

namespace py = pybind11;

namespace hvdcompat {

namespace {

BufferDesc MakeBuffer(uintptr_t data, DataType dtype, std::vector<int64_t> shape, int device) {
  if (static_cast<int>(dtype) >= kNumDataTypes) {
    throw py::value_error("Buffer: unknown dtype " + std::to_string(static_cast<int>(dtype)) +
                          "; use a member of hvdcompat._core.DType");
  }
  for (int64_t d : shape) {
    if (d < 0) {
      throw py::value_error("Buffer: shape " + ShapeString(shape) +
                            " has a negative dimension; pass a tensor's own shape");
    }
  }
  // Throws ValueError (InvalidArgument) when the element count overflows.
  CheckedMul(ShapeElements(shape), static_cast<int64_t>(DataTypeSize(dtype)),
             "Buffer: bytes of a tensor");
  BufferDesc b;
  b.data = reinterpret_cast<void*>(data);
  b.dtype = dtype;
  b.shape = std::move(shape);
  b.device = device;
  return b;
}

// An enum member made from an out-of-range int (Op(99)) is refused.
OpType CheckedOp(OpType op) {
  if (static_cast<int>(op) > static_cast<int>(OpType::kJoin)) {
    throw py::value_error("EnqueueArgs: unknown op " + std::to_string(static_cast<int>(op)) +
                          "; use a member of hvdcompat._core.Op");
  }
  return op;
}

}  // namespace

ReduceOp CheckedReduceOp(ReduceOp op) {
  if (static_cast<int>(op) > static_cast<int>(ReduceOp::kProduct)) {
    throw py::value_error("unknown reduce op " + std::to_string(static_cast<int>(op)) +
                          "; use a member of hvdcompat._core.ReduceOp");
  }
  return op;
}

namespace {

// The core's codes as Python enums (c10d binds its ReduceOp the same way);
// the dicts name -> member stay for callers that look a code up by name.
void BindEnums(py::module_& m) {
  py::enum_<DataType> dtype(m, "DType", py::arithmetic(), "A tensor's element type.");
  py::dict dtypes;
  for (int i = 0; i < kNumDataTypes; ++i) {
    const auto dt = static_cast<DataType>(i);
    dtype.value(DataTypeName(dt), dt);
    dtypes[DataTypeName(dt)] = dt;
  }
  m.attr("DTYPES") = dtypes;
  py::enum_<OpType> op(m, "Op", py::arithmetic(), "A collective operation.");
  py::dict ops;
  for (OpType o : {OpType::kAllreduce, OpType::kAllgather, OpType::kBroadcast, OpType::kAlltoall,
                   OpType::kReducescatter, OpType::kBarrier, OpType::kJoin}) {
    op.value(OpTypeName(o), o);
    ops[OpTypeName(o)] = o;
  }
  m.attr("OPS") = ops;
  // Horovod's numbering (hvd.Average == 0 ... hvd.Product == 5).
  py::enum_<ReduceOp> reduce(m, "ReduceOp", py::arithmetic(), "How an allreduce combines ranks.");
  py::dict reduce_ops;
  for (ReduceOp r : {ReduceOp::kAverage, ReduceOp::kSum, ReduceOp::kAdasum, ReduceOp::kMin,
                     ReduceOp::kMax, ReduceOp::kProduct}) {
    reduce.value(ReduceOpName(r), r);
    reduce_ops[ReduceOpName(r)] = r;
  }
  m.attr("REDUCE_OPS") = reduce_ops;
  py::enum_<StatusCode> status(m, "Status", py::arithmetic(), "How an op ended (wait()).");
  py::dict statuses;
  for (auto [name, code] : {std::pair<const char*, StatusCode>{"ok", StatusCode::kOk},
                            {"invalid_argument", StatusCode::kInvalidArgument},
                            {"precondition", StatusCode::kPrecondition},
                            {"aborted", StatusCode::kAborted},
                            {"internal", StatusCode::kInternal}}) {
    status.value(name, code);
    statuses[name] = code;
  }
  m.attr("STATUS") = statuses;
}

void BindResults(py::module_& m) {
  py::class_<WaitResult>(m, "WaitResult", "What wait() returns for a finished op.")
      .def_readonly("status", &WaitResult::status)
      .def_readonly("message", &WaitResult::message)
      .def_readonly("outputs", &WaitResult::outputs)
      .def_readonly("received_splits", &WaitResult::received_splits)
      .def_readonly("join_last_rank", &WaitResult::join_last_rank);
}

void BindArguments(py::module_& m) {
  py::class_<BufferDesc>(m, "Buffer", "One tensor's memory as the core reads or writes it.")
      .def(py::init(&MakeBuffer), py::arg("data"), py::arg("dtype"), py::arg("shape"),
           py::arg("device") = kCpuDevice)
      .def_property_readonly("data",
                             [](const BufferDesc& b) { return reinterpret_cast<uintptr_t>(b.data); })
      .def_readonly("dtype", &BufferDesc::dtype)
      .def_readonly("shape", &BufferDesc::shape)
      .def_readonly("device", &BufferDesc::device);

  py::class_<EnqueueArgs>(m, "EnqueueArgs", "One op handed to the core by enqueue().")
      .def(py::init([](OpType op, std::string name, bool auto_named, int process_set,
                       ReduceOp reduce_op,
                       int root, double prescale, double postscale, std::vector<BufferDesc> inputs,
                       std::vector<BufferDesc> outputs, std::vector<std::vector<int64_t>> splits,
                       std::optional<uintptr_t> stream) {
             EnqueueArgs a;
             a.op = CheckedOp(op);
             a.name = std::move(name);
             a.auto_named = auto_named;
             a.process_set = process_set;
             a.reduce_op = CheckedReduceOp(reduce_op);
             a.root = root;
             a.prescale = prescale;
             a.postscale = postscale;
             a.inputs = std::move(inputs);
             a.outputs = std::move(outputs);
             a.splits = std::move(splits);
             a.stream = stream ? reinterpret_cast<void*>(*stream) : nullptr;
             return a;
           }),
           py::arg("op"), py::arg("name"), py::arg("auto_named") = false,
           py::arg("process_set") = 0, py::arg("reduce_op") = EnqueueArgs().reduce_op,
           py::arg("root") = -1, py::arg("prescale") = 1.0, py::arg("postscale") = 1.0,
           py::arg("inputs") = std::vector<BufferDesc>(),
           py::arg("outputs") = std::vector<BufferDesc>(),
           py::arg("splits") = std::vector<std::vector<int64_t>>(), py::arg("stream") = py::none())
      .def_readonly("op", &EnqueueArgs::op)
      .def_readonly("name", &EnqueueArgs::name)
      .def_readonly("auto_named", &EnqueueArgs::auto_named)
      .def_readonly("process_set", &EnqueueArgs::process_set)
      .def_readonly("reduce_op", &EnqueueArgs::reduce_op)
      .def_readonly("root", &EnqueueArgs::root)
      .def_readonly("prescale", &EnqueueArgs::prescale)
      .def_readonly("postscale", &EnqueueArgs::postscale)
      .def_readonly("inputs", &EnqueueArgs::inputs)
      .def_readonly("outputs", &EnqueueArgs::outputs)
      .def_readonly("splits", &EnqueueArgs::splits)
      .def_property_readonly("stream", [](const EnqueueArgs& a) -> std::optional<uintptr_t> {
        if (!a.stream) return std::nullopt;
        return reinterpret_cast<uintptr_t>(a.stream);
      });

  py::class_<InitOptions>(m, "InitOptions", "What hvd.init() asks of the core.")
      .def(py::init([](std::optional<int64_t> comm_handle, std::vector<int> ranks,
                       std::vector<std::vector<int>> process_sets,
                       std::vector<std::pair<bool, std::optional<std::vector<int>>>> requested_sets,
                       std::string refused, bool dynamic_process_sets, std::string controller,
                       py::object store, int rank, int size, int local_rank, int local_size,
                       int cross_rank, int cross_size, std::string hostname,
                       std::string gloo_iface, std::string gloo_hostname, double gloo_timeout_s,
                       std::optional<std::string> comm_text, std::string comm_refused,
                       std::string gloo_join) {
             InitOptions o;
             // Note [Agreeing on init's comm]: hvd.init passes how its comm reads.
             o.agree_on_comm = comm_text.has_value();
             o.comm_text = comm_text.value_or("None");
             o.comm_refused = std::move(comm_refused);
             if (controller != "mpi" && controller != "gloo") {
               throw py::value_error("InitOptions: controller must be 'mpi' or 'gloo', not '" +
                                     controller + "'");
             }
             o.controller = std::move(controller);
             GlooOptions& g = o.gloo;
             g.store = WrapPythonStore(std::move(store));
             g.rank = rank;
             g.size = size;
             g.local_rank = local_rank;
             g.local_size = local_size;
             g.cross_rank = cross_rank;
             g.cross_size = cross_size;
             g.hostname = std::move(hostname);
             g.iface = std::move(gloo_iface);
             g.bind_host = std::move(gloo_hostname);
             g.timeout_s = gloo_timeout_s;
             g.join = std::move(gloo_join);
             // A Fortran handle (mpi4py's Comm.py2f()): the one form of a
             // communicator that every MPI defines as an integer. MPI_Comm
             // itself is a pointer in Open MPI and an int in the MPICH family.
             if (comm_handle) o.comm = MPI_Comm_f2c(static_cast<MPI_Fint>(*comm_handle));
             o.ranks = std::move(ranks);
             o.process_sets = std::move(process_sets);
             // (from an mpi4py communicator, its ranks: this rank's group, None
             // when this rank's communicator is COMM_NULL)
             for (auto& [from_comm, set_ranks] : requested_sets) {
               o.requested_sets.push_back(
                   {from_comm, set_ranks.has_value(), set_ranks.value_or(std::vector<int>())});
             }
             o.refused = std::move(refused);
             o.dynamic_process_sets = dynamic_process_sets;
             return o;
           }),
           py::kw_only(), py::arg("comm_handle") = py::none(),
           py::arg("ranks") = std::vector<int>(),
           py::arg("process_sets") = std::vector<std::vector<int>>(),
           py::arg("requested_sets") =
               std::vector<std::pair<bool, std::optional<std::vector<int>>>>(),
           py::arg("refused") = std::string(), py::arg("dynamic_process_sets") = false,
           py::arg("controller") = "mpi", py::arg("store") = py::none(), py::arg("rank") = -1,
           py::arg("size") = -1, py::arg("local_rank") = -1, py::arg("local_size") = -1,
           py::arg("cross_rank") = -1, py::arg("cross_size") = -1, py::arg("hostname") = "",
           py::arg("gloo_iface") = "", py::arg("gloo_hostname") = "",
           py::arg("gloo_timeout_s") = 30.0, py::arg("comm_text") = py::none(),
           py::arg("comm_refused") = std::string(), py::arg("gloo_join") = std::string())
      .def_readonly("controller", &InitOptions::controller)
      .def_property_readonly("gloo_timeout_s",
                             [](const InitOptions& o) { return o.gloo.timeout_s; })
      .def_property_readonly("comm_handle",
                             [](const InitOptions& o) -> std::optional<int64_t> {
                               if (!o.comm) return std::nullopt;
                               return static_cast<int64_t>(MPI_Comm_c2f(*o.comm));
                             })
      .def_readonly("ranks", &InitOptions::ranks)
      .def_readonly("process_sets", &InitOptions::process_sets)
      .def_property_readonly(
          "requested_sets",
          [](const InitOptions& o) {
            std::vector<std::pair<bool, std::optional<std::vector<int>>>> v;
            for (const auto& s : o.requested_sets) {
              v.emplace_back(s.from_comm, s.member ? std::optional<std::vector<int>>(s.ranks)
                                                   : std::nullopt);
            }
            return v;
          })
      .def_readonly("refused", &InitOptions::refused)
      .def_readonly("dynamic_process_sets", &InitOptions::dynamic_process_sets);
}

// The core's error classes, as Horovod's users catch them: each is a
// ValueError too (InvalidArgument is one).

void BindErrors(py::module_& m) {
  // Never freed: the translator may run until the interpreter's teardown.
  static PyObject* unsupported_dtype = PyErr_NewException(
      "hvdcompat._core.UnsupportedDtypeError",
      py::make_tuple(py::handle(PyExc_TypeError), py::handle(PyExc_ValueError)).ptr(), nullptr);
  static PyObject* not_supported = PyErr_NewException(
      "hvdcompat._core.NotSupportedError",
      py::make_tuple(py::handle(PyExc_NotImplementedError), py::handle(PyExc_ValueError)).ptr(),
      nullptr);
  if (!unsupported_dtype || !not_supported) throw py::error_already_set();
  m.attr("UnsupportedDtypeError") = py::handle(unsupported_dtype);
  m.attr("NotSupportedError") = py::handle(not_supported);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const UnsupportedDtype& e) {
      PyErr_SetString(unsupported_dtype, e.what());
    } catch (const NotSupported& e) {
      PyErr_SetString(not_supported, e.what());
    }
  });
}

}  // namespace

void BindTypes(py::module_& m) {
  BindEnums(m);
  BindErrors(m);
  BindArguments(m);
  BindResults(m);
}

}  // namespace hvdcompat
