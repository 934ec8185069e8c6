#include "gpu/gpu_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <sstream>

#include "core/common.h"
#include "core/env.h"
#include "gpu/gpu_check.h"

namespace hvdcompat {

namespace {

// One place a library was looked for, and what happened there.
struct Attempt {
  std::string where;
  std::string outcome;
};

std::string Describe(const std::vector<Attempt>& attempts) {
  std::string s;
  for (const auto& a : attempts) s += "\n  - " + a.where + ": " + a.outcome;
  return s;
}

std::string DlErrorText() {
  const char* e = dlerror();
  return e ? e : "unknown dynamic loader error";
}

// Resolves every listed symbol or throws LibraryError naming the first
// missing one (a copy of the library that is too old or not the library).
template <typename Fn>
void Require(void* handle, const std::string& path, const char* symbol, Fn* out) {
  dlerror();
  void* p = dlsym(handle, symbol);
  if (!p) {
    throw LibraryError(path + " lacks the symbol " + symbol + " (" + DlErrorText() +
                       "); it is not a usable copy of the library, or it is too old");
  }
  *out = reinterpret_cast<Fn>(p);
}

template <typename Fn>
void Optional(void* handle, const char* symbol, Fn* out) {
  dlerror();
  *out = reinterpret_cast<Fn>(dlsym(handle, symbol));
}

void BindCuda(void* h, const std::string& path, CudaApi* api) {
  api->path = path;
  Require(h, path, "cudaGetErrorString", &api->GetErrorString);
  Require(h, path, "cudaGetLastError", &api->GetLastError);
  Require(h, path, "cudaRuntimeGetVersion", &api->RuntimeGetVersion);
  Require(h, path, "cudaGetDeviceCount", &api->GetDeviceCount);
  Require(h, path, "cudaGetDevice", &api->GetDevice);
  Require(h, path, "cudaSetDevice", &api->SetDevice);
  Require(h, path, "cudaDeviceGetPCIBusId", &api->DeviceGetPCIBusId);
  Require(h, path, "cudaStreamCreateWithFlags", &api->StreamCreateWithFlags);
  Require(h, path, "cudaStreamDestroy", &api->StreamDestroy);
  Require(h, path, "cudaStreamSynchronize", &api->StreamSynchronize);
  Require(h, path, "cudaStreamWaitEvent", &api->StreamWaitEvent);
  Require(h, path, "cudaEventCreateWithFlags", &api->EventCreateWithFlags);
  Require(h, path, "cudaEventDestroy", &api->EventDestroy);
  Require(h, path, "cudaEventRecord", &api->EventRecord);
  Require(h, path, "cudaEventQuery", &api->EventQuery);
  Require(h, path, "cudaEventSynchronize", &api->EventSynchronize);
  Require(h, path, "cudaMalloc", &api->Malloc);
  Require(h, path, "cudaFree", &api->Free);
  Require(h, path, "cudaHostAlloc", &api->HostAlloc);
  Require(h, path, "cudaFreeHost", &api->FreeHost);
  Require(h, path, "cudaMemcpyAsync", &api->MemcpyAsync);
  Require(h, path, "cudaMemcpy2DAsync", &api->Memcpy2DAsync);
  Require(h, path, "cudaMemsetAsync", &api->MemsetAsync);
  Optional(h, "cudaStreamCreateWithPriority", &api->StreamCreateWithPriority);
  Optional(h, "cudaDeviceGetStreamPriorityRange", &api->DeviceGetStreamPriorityRange);
  Optional(h, "cudaMallocAsync", &api->MallocAsync);
  Optional(h, "cudaFreeAsync", &api->FreeAsync);
  Optional(h, "cudaDeviceGetAttribute", &api->DeviceGetAttribute);
  Optional(h, "cudaDeviceGetDefaultMemPool", &api->DeviceGetDefaultMemPool);
  Optional(h, "cudaMemPoolSetAttribute", &api->MemPoolSetAttribute);
  Optional(h, "cudaMemPoolGetAttribute", &api->MemPoolGetAttribute);
  int v = 0;
  if (api->RuntimeGetVersion(&v) == cudaSuccess) api->runtime_version = v;
}

void BindNccl(void* h, const std::string& path, NcclApi* api) {
  api->path = path;
  Require(h, path, "ncclGetVersion", &api->GetVersion);
  Require(h, path, "ncclGetErrorString", &api->GetErrorString);
  Require(h, path, "ncclGetUniqueId", &api->GetUniqueId);
  Require(h, path, "ncclCommInitRank", &api->CommInitRank);
  Require(h, path, "ncclCommDestroy", &api->CommDestroy);
  Require(h, path, "ncclCommAbort", &api->CommAbort);
  Require(h, path, "ncclCommGetAsyncError", &api->CommGetAsyncError);
  Require(h, path, "ncclAllReduce", &api->AllReduce);
  Require(h, path, "ncclBroadcast", &api->Broadcast);
  Require(h, path, "ncclAllGather", &api->AllGather);
  Require(h, path, "ncclReduceScatter", &api->ReduceScatter);
  Require(h, path, "ncclSend", &api->Send);
  Require(h, path, "ncclRecv", &api->Recv);
  Require(h, path, "ncclGroupStart", &api->GroupStart);
  Require(h, path, "ncclGroupEnd", &api->GroupEnd);
  Optional(h, "ncclRedOpCreatePreMulSum", &api->RedOpCreatePreMulSum);
  Optional(h, "ncclRedOpDestroy", &api->RedOpDestroy);
  Optional(h, "ncclGetLastError", &api->GetLastError);
  int v = 0;
  if (api->GetVersion(&v) != ncclSuccess || v <= 0) {
    throw LibraryError(path + ": ncclGetVersion failed; not a usable NCCL");
  }
  api->version = v;
}

// Tries `where` (a path or soname); on success binds it with `bind` and
// returns true. RTLD_NOLOAD only finds copies already in the process.
template <typename Api>
bool TryOne(const std::string& where, bool already_loaded_only,
            void (*bind)(void*, const std::string&, Api*), Api* api,
            std::vector<Attempt>* attempts) {
  std::string label = already_loaded_only ? where + " (already loaded in this process)" : where;
  dlerror();
  int flags = RTLD_NOW | RTLD_LOCAL | (already_loaded_only ? RTLD_NOLOAD : 0);
  void* h = dlopen(where.c_str(), flags);
  if (!h) {
    attempts->push_back({label, already_loaded_only ? "not loaded" : DlErrorText()});
    return false;
  }
  try {
    bind(h, where, api);
  } catch (const std::exception& e) {
    attempts->push_back({label, e.what()});
    return false;
  }
  return true;
}

template <typename Api>
std::string Load(Knob override_knob, const std::vector<std::string>& sonames,
                 const std::vector<std::string>& candidates,
                 void (*bind)(void*, const std::string&, Api*), const char* library,
                 const char* wheel, Api* api) {
  std::vector<Attempt> attempts;
  std::string source;
  std::string explicit_path = KnobString(override_knob, &source);
  const std::string var = std::string("HVDCOMPAT_") + SpecOf(override_knob).suffix;
  if (!explicit_path.empty()) {
    if (TryOne(explicit_path, false, bind, api, &attempts)) return "";
    return std::string(library) + " could not be loaded from " + var + "=" + explicit_path + ":" +
           Describe(attempts) + "\nPoint " + var + " at the library file itself (for example " +
           ".../site-packages/nvidia/" + wheel + "), or unset it to search the usual places.";
  }
  for (const auto& s : sonames) {
    if (TryOne(s, true, bind, api, &attempts)) return "";
  }
  for (const auto& c : candidates) {
    if (TryOne(c, false, bind, api, &attempts)) return "";
  }
  for (const auto& s : sonames) {
    if (TryOne(s, false, bind, api, &attempts)) return "";
  }
  return std::string(library) + " was not found. Looked in:" + Describe(attempts) +
         "\nInstall a CUDA build of PyTorch (its nvidia-* wheels provide the library), or set " +
         var + "=/path/to/" + sonames.front() + ".";
}

struct ProcessState {
  std::once_flag once;
  std::mutex mu;
  GpuSearchPaths paths;  // guarded by mu, read once by the loader
  GpuLibraries libs;     // immutable after the load
};

ProcessState& State() {
  // Never destroyed: DLPack deleters may call into the library at exit.
  static ProcessState* s = new ProcessState();
  return *s;
}

}  // namespace

GpuLibraries LoadGpuLibraries(const GpuSearchPaths& extra) {
  GpuLibraries g;
  g.cuda_error = Load<CudaApi>(Knob::kCudartLib,
                               {"libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0",
                                "libcudart.so"},
                               extra.cudart, &BindCuda, "The CUDA runtime (libcudart)",
                               "cuda_runtime/lib/libcudart.so.12 or .../nvidia/cu13/lib/"
                               "libcudart.so.13", &g.cuda);
  if (!g.cuda_ok()) {
    g.nccl_error = "NCCL was not loaded because the CUDA runtime is missing: " + g.cuda_error;
    return g;
  }
  g.nccl_error = Load<NcclApi>(Knob::kNcclLib, {"libnccl.so.2", "libnccl.so"}, extra.nccl,
                               &BindNccl, "NCCL (libnccl)", "nccl/lib/libnccl.so.2", &g.nccl);
  return g;
}

void SetGpuSearchPaths(GpuSearchPaths paths) {
  ProcessState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  s.paths = std::move(paths);
}

const GpuLibraries& Gpu() {
  ProcessState& s = State();
  std::call_once(s.once, [&s] {
    GpuSearchPaths paths;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      paths = s.paths;
    }
    s.libs = LoadGpuLibraries(paths);
  });
  return s.libs;
}

const CudaApi& Cuda() {
  const GpuLibraries& g = Gpu();
  if (!g.cuda_ok()) throw LibraryError(g.cuda_error);
  return g.cuda;
}

const NcclApi& Nccl() {
  const GpuLibraries& g = Gpu();
  if (!g.nccl_ok()) throw LibraryError(g.nccl_error);
  return g.nccl;
}

std::string NcclVersionString(int code) {
  if (code <= 0) return "none";
  int major, minor, patch;
  if (code >= 10000) {
    major = code / 10000;
    minor = (code / 100) % 100;
    patch = code % 100;
  } else {
    major = code / 1000;
    minor = (code / 100) % 10;
    patch = code % 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

}  // namespace hvdcompat
