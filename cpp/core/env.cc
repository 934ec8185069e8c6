#include "core/env.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#include "core/common.h"

namespace hvdcompat {

const std::vector<KnobSpec>& AllKnobs() {
  static const std::vector<KnobSpec> knobs = {
      {Knob::kFusionThreshold, "FUSION_THRESHOLD", true, "134217728", "bytes",
       "Fuse small tensors into one collective up to this many bytes (0 disables fusion)."},
      {Knob::kCycleTimeMs, "CYCLE_TIME", true, "0", "ms",
       "After the engine wakes up, wait this long for more tensors before negotiating."},
      {Knob::kCacheCapacity, "CACHE_CAPACITY", true, "1024", "entries",
       "Response cache size; steady-state negotiation sends only ready bits (0 disables)."},
      {Knob::kStallCheckTimeSeconds, "STALL_CHECK_TIME_SECONDS", true, "60", "s",
       "Warn when a tensor has been submitted by some ranks but not others for this long."},
      {Knob::kStallShutdownTimeSeconds, "STALL_SHUTDOWN_TIME_SECONDS", true, "0", "s",
       "Fail stalled operations with an error after this long (0 never)."},
      {Knob::kShutdownTimeoutSeconds, "SHUTDOWN_TIMEOUT_SECONDS", false, "30", "s",
       "hvd.shutdown() (and exit) ends a collective still waiting on a stopped peer after this "
       "long, with an error, and skips MPI_Finalize (0: wait forever)."},
      {Knob::kInitTimeoutSeconds, "INIT_TIMEOUT_SECONDS", false, "600", "s",
       "hvd.init() fails, naming them, when processes that its comm says form the job have "
       "not joined it after this long (0: wait forever)."},
      {Knob::kStallCheckDisable, "STALL_CHECK_DISABLE", true, "0", "bool",
       "Disable the stall inspector."},
      {Knob::kTimeline, "TIMELINE", true, "", "path",
       "Write a Chrome-trace timeline to this file (DYNAMIC: start with hvd.start_timeline)."},
      {Knob::kTimelineMarkCycles, "TIMELINE_MARK_CYCLES", true, "0", "bool",
       "Mark each negotiation cycle in the timeline."},
      {Knob::kLogLevel, "LOG_LEVEL", true, "warning", "level",
       "trace, debug, info, warning, error or fatal."},
      {Knob::kLogHideTime, "LOG_HIDE_TIME", true, "0", "bool",
       "Omit timestamps from log lines."},
      {Knob::kNumNcclStreams, "NUM_NCCL_STREAMS", true, "1", "streams",
       "Parallel NCCL streams/communicators for GPU collectives."},
      {Knob::kHierarchicalAllreduce, "HIERARCHICAL_ALLREDUCE", true, "0", "bool",
       "Allreduce as intra-node reduce-scatter, inter-node allreduce, intra-node allgather "
       "(host tensors over MPI or Gloo, CUDA tensors over NCCL). Unset: on MPI, host tensors "
       "take it when the ranks span hosts with the same number (> 1) on each "
       "(HVDCOMPAT_LINK_PLAN)."},
      {Knob::kGpuOperations, "GPU_OPERATIONS", true, "NCCL", "NCCL|MPI|GLOO",
       "Backend for CUDA tensors; MPI (or GLOO, the same) stages through host memory and the "
       "controller's host collectives."},
      {Knob::kDynamicProcessSets, "DYNAMIC_PROCESS_SETS", true, "0", "bool",
       "Allow hvd.add_process_set/remove_process_set after init."},
      {Knob::kFusionChunkBytes, "FUSION_CHUNK_BYTES", false, "1048576", "bytes",
       "Pack/reduce/unpack of a fused buffer is pipelined in chunks of this size."},
      {Knob::kInPlaceMinBytes, "INPLACE_MIN_BYTES", false, "262144", "bytes",
       "Tensors at least this large are reduced in place, without the fusion copy."},
      {Knob::kMaxCallBytes, "MAX_CALL_BYTES", false, "16777216", "bytes",
       "Larger in-place reductions are split into equal MPI calls of at most this size."},
      {Knob::kOutputPoolBytes, "OUTPUT_POOL_BYTES", false, "268435456", "bytes",
       "Host outputs of out-of-place collectives (256 KiB and up) come from a pool of "
       "reused buffers of at most this many bytes (0 disables)."},
      {Knob::kPollSpinMicros, "POLL_SPIN_MICROS", false, "50", "us",
       "While negotiating, and before sleeping for want of work, the engine polls back to back "
       "(never yielding) this long before sleeping."},
      {Knob::kPollMaxSleepMicros, "POLL_MAX_SLEEP_MICROS", false, "200", "us",
       "Longest sleep between polls while waiting for peers."},
      {Knob::kPollDataSpinMicros, "POLL_DATA_SPIN_MICROS", false, "50", "us",
       "While a data collective is in flight, test it back to back (never yielding) this long "
       "before sleeping."},
      {Knob::kEngineSliceMicros, "ENGINE_SLICE_MICROS", false, "100", "us",
       "Scheduler time slice the engine's threads ask for (Linux 6.12 and later; elsewhere "
       "ignored): a short slice lets a waking engine thread run at once on a core that training "
       "threads keep busy. 0 keeps the scheduler's default."},
      {Knob::kWaitSpinMicros, "WAIT_SPIN_MICROS", false, "100", "us",
       "hvd.synchronize() busy-polls an unfinished handle this long before sleeping on it."},
      {Knob::kEnableAsyncCompletion, "ENABLE_ASYNC_COMPLETION", true, "0", "bool",
       "GPU ops: synchronize() makes the current CUDA stream wait instead of blocking the host."},
      {Knob::kNcclLib, "NCCL_LIB", false, "", "path",
       "libnccl to load (default: torch's copy, the nvidia-nccl wheel, then the system's)."},
      {Knob::kCudartLib, "CUDART_LIB", false, "", "path",
       "libcudart to load (default: torch's copy, the nvidia-cuda-runtime wheel, the system's)."},
      {Knob::kHierarchicalLocalSize, "HIERARCHICAL_LOCAL_SIZE", false, "0", "ranks",
       "For testing: nodes of the hierarchical collectives are ranks r with equal r / N "
       "(0: ranks sharing memory)."},
      {Knob::kAutotune, "AUTOTUNE", true, "0", "bool",
       "Search fusion threshold, cycle time, chunk size and call split while training."},
      {Knob::kAutotuneLog, "AUTOTUNE_LOG", true, "", "path",
       "Rank 0 writes every configuration the autotuner scored, and the best, to this CSV."},
      {Knob::kAutotuneWarmupSamples, "AUTOTUNE_WARMUP_SAMPLES", true, "3", "samples",
       "Autotune: scores of the starting configuration discarded before the search."},
      {Knob::kAutotuneStepsPerSample, "AUTOTUNE_STEPS_PER_SAMPLE", true, "10", "steps",
       "Autotune: training steps per sample (a configuration's score is a median of 5)."},
      {Knob::kAutotuneBayesOptMaxSamples, "AUTOTUNE_BAYES_OPT_MAX_SAMPLES", true, "20", "samples",
       "Autotune: configurations scored by the Bayesian optimisation before it stops."},
      {Knob::kAutotuneGaussianProcessNoise, "AUTOTUNE_GAUSSIAN_PROCESS_NOISE", true, "0.8", "sd",
       "Autotune: score noise assumed by the Gaussian process, in units of the scores' spread."},
      {Knob::kHierarchicalAllgather, "HIERARCHICAL_ALLGATHER", true, "0", "bool",
       "Host allgather as gather to each node's first rank, allgather among those, "
       "intra-node broadcast."},
      {Knob::kLinkPlan, "LINK_PLAN", false, "auto", "auto|host|network",
       "Host allreduce transport: network (pipelined segments, hierarchical with several ranks "
       "per host; on Gloo, the ring with the 16-bit wire) when the ranks span hosts, host "
       "(cache-sized chunks) otherwise; or forced."},
      {Knob::kNetworkSegmentBytes, "NETWORK_SEGMENT_BYTES", false, "4194304", "bytes",
       "Network plan: host allreduces run as pipelined calls of at most this size."},
      {Knob::kNetworkPipelineDepth, "NETWORK_PIPELINE_DEPTH", false, "3", "segments",
       "Network plan: segments in flight at once (the next is packed while they travel)."},
      {Knob::kNetwork16BitWire, "NETWORK_16BIT_WIRE", false, "1", "bool",
       "Network plan (either controller): float16/bfloat16 cross hosts as 16 bits, each "
       "reduction step rounding (as Horovod); 0 widens them to float32 on the link (one "
       "rounding, twice the bytes)."},
      {Knob::kGlooSegmentBytes, "GLOO_SEGMENT_BYTES", false, "1048576", "bytes",
       "Gloo controller: the host allreduce's ring moves segments of at most this size."},
      {Knob::kGlooPipelineDepth, "GLOO_PIPELINE_DEPTH", false, "4", "segments",
       "Gloo controller: reduce-scatter receives the ring posts ahead (its temporary segments)."},
      {Knob::kGlooExchangeMaxBytes, "GLOO_EXCHANGE_MAX_BYTES", false, "65536", "bytes",
       "Gloo controller: an allreduce whose payload times (ranks - 1) is at most this skips "
       "the ring; every rank sends its whole contribution to every other (one latency)."},
      // Elastic training (read by hvd.elastic; hvdcompatrun's elastic flags set them).
      {Knob::kElasticMinNp, "ELASTIC_MIN_NP", false, "", "ranks",
       "hvd.elastic.run fails when fewer ranks than this survive a reset (--min-np)."},
      {Knob::kElasticResetLimit, "ELASTIC_RESET_LIMIT", false, "", "resets",
       "hvd.elastic.run fails after this many resets (--reset-limit; empty: no limit)."},
      {Knob::kElasticDir, "ELASTIC_DIR", false, "", "path",
       "Directory of the elastic driver's host notices and the ranks' completion marks."},
      {Knob::kElasticHost, "ELASTIC_HOST", false, "", "name",
       "This rank's host name as host discovery lists it (default: the machine's name)."},
      {Knob::kElasticJoin, "ELASTIC_JOIN", false, "", "name",
       "Set by hvdcompatrun --gloo on a worker it starts on a host added to a running elastic "
       "job: hvd.init() waits to be taken into that job at its next reset (the worker's name)."},
      {Knob::kThreadAffinity, "THREAD_AFFINITY", true, "", "cores",
       "Comma-separated cores, one per local rank: local rank i's engine threads run on the "
       "i-th (empty: not pinned)."},
      {Knob::kElastic, "ELASTIC", true, "0", "bool",
       "Set to 1 by the elastic launcher: optimizers keep communicating while one rank is left."},
      // torch.distributed DDP integration (read by hvdcompat.ddp).
      {Knob::kDdpAccelerate, "DDP_ACCELERATE", false, "1", "bool",
       "Importing hvdcompat.ddp.accelerate gives DDP models built afterwards hvdcompat's "
       "comm hook (0: leave DDP untouched)."},
      {Knob::kDdpCompression, "DDP_COMPRESSION", false, "none", "none|fp16|bf16",
       "Wire dtype of the DDP comm hook's gradient allreduce."},
      {Knob::kDdpRoute, "DDP_ROUTE", false, "auto", "auto|engine|process_group",
       "Where the DDP comm hook reduces buckets: hvdcompat's engine, or the script's own "
       "process group (auto: the engine when its world is DDP's group: under an MPI launcher, "
       "or torchrun / hvdcompatrun --gloo with the Gloo controller)."},
      {Knob::kDdpFusionThreshold, "DDP_FUSION_THRESHOLD", false, "0", "bytes",
       "DDP comm hook, process-group route: pack consecutive buckets into one op up to this size "
       "(0: off, which keeps backward and communication overlapped)."},
      // The launchers (read by hvdcompat.run and hvdcompatrun).
      {Knob::kStartTimeout, "START_TIMEOUT", true, "30", "s",
       "hvdcompat.run and hvdcompatrun --gloo: seconds every rank has to start and connect "
       "back (--start-timeout)."},
      {Knob::kGlooTimeoutSeconds, "GLOO_TIMEOUT_SECONDS", true, "30", "s",
       "Gloo controller: seconds a rank waits for the launch's store and its peers "
       "(hvdcompatrun --gloo passes it to the ranks; --gloo-timeout-seconds)."},
      {Knob::kGlooPeerTimeoutSeconds, "GLOO_PEER_TIMEOUT_SECONDS", false, "20", "s",
       "Gloo controller: a peer none of whose connections has answered for this long (its "
       "host went down or dropped off the network) is lost, and pending collectives fail "
       "naming it; a busy or stopped process still answers (0: never)."},
      {Knob::kMpirun, "MPIRUN", false, "", "path",
       "The mpirun hvdcompatrun and hvdcompat.run start (default: the one beside the MPI "
       "hvdcompat was built with, then PATH)."},
      {Knob::kController, "CONTROLLER", true, "auto", "auto|mpi|gloo",
       "The controller hvd.init() starts (auto: MPI under an MPI launcher or for a lone "
       "process, Gloo under hvdcompatrun --gloo, torchrun or the env:// variables)."},
      {Knob::kReportFd, "REPORT_FD", false, "0", "fd",
       "Set by hvdcompatrun's rank supervisor: the engine writes the ranks it lost there, for "
       "the launcher's failure line (0: nowhere)."},
  };
  return knobs;
}

const KnobSpec& SpecOf(Knob knob) {
  for (const auto& k : AllKnobs()) {
    if (k.knob == knob) return k;
  }
  throw InternalError("knob without a declaration");
}

namespace {

std::string Lower(std::string v) {
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v;
}

[[noreturn]] void BadValue(const KnobSpec& spec, const std::string& value,
                           const std::string& source, const std::string& expected) {
  throw InvalidArgument(source + "=" + value + " is not valid: expected " + expected + " (" +
                        spec.help + ")");
}

[[noreturn]] void BadValue(Knob knob, const std::string& value, const std::string& source,
                           const std::string& expected) {
  BadValue(SpecOf(knob), value, source, expected);
}

std::vector<std::string> Choices(const KnobSpec& spec) {
  std::vector<std::string> out;
  std::string unit = spec.unit;
  size_t start = 0;
  while (true) {
    size_t bar = unit.find('|', start);
    out.push_back(unit.substr(start, bar == std::string::npos ? std::string::npos : bar - start));
    if (bar == std::string::npos) return out;
    start = bar + 1;
  }
}

}  // namespace

KnobKind KindOf(const KnobSpec& spec) {
  const std::string unit = spec.unit;
  if (unit == "bool") return KnobKind::kBool;
  if (unit.find('|') != std::string::npos) return KnobKind::kChoice;
  if (unit == "path" || unit == "name" || unit == "cores" || unit == "level") {
    return KnobKind::kText;
  }
  if (unit == "ms" || unit == "s" || unit == "sd") return KnobKind::kFloat;
  if (unit == "bytes" || unit == "entries" || unit == "streams" || unit == "us" ||
      unit == "ranks" || unit == "resets" || unit == "samples" || unit == "steps" ||
      unit == "segments" || unit == "fd") {
    return KnobKind::kInt;
  }
  throw InternalError(std::string("knob HVDCOMPAT_") + spec.suffix + " has unit '" + unit +
                      "', which names no kind (core/env.cc KindOf)");
}

const char* KindName(KnobKind kind) {
  switch (kind) {
    case KnobKind::kBool: return "bool";
    case KnobKind::kInt: return "int";
    case KnobKind::kFloat: return "float";
    case KnobKind::kChoice: return "choice";
    case KnobKind::kText: return "text";
  }
  return "text";
}

const EnvLookup& ProcessEnvironment() {
  static const EnvLookup lookup = [](const std::string& name, std::string* value) {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return false;
    *value = v;
    return true;
  };
  return lookup;
}

std::string KnobRaw(const KnobSpec& spec, const EnvLookup& env, std::string* source) {
  std::string ours = std::string("HVDCOMPAT_") + spec.suffix;
  std::string value;
  if (env(ours, &value)) {
    if (source) *source = ours;
    return value;
  }
  if (spec.horovod_alias) {
    std::string theirs = std::string("HOROVOD_") + spec.suffix;
    if (env(theirs, &value)) {
      if (source) *source = theirs;
      return value;
    }
  }
  if (source) *source = std::string("default of HVDCOMPAT_") + spec.suffix;
  return spec.default_value;
}

std::string KnobString(Knob knob, std::string* source) {
  return KnobRaw(SpecOf(knob), ProcessEnvironment(), source);
}

bool KnobExplicit(Knob knob) {
  const KnobSpec& spec = SpecOf(knob);
  std::string unused;
  if (ProcessEnvironment()(std::string("HVDCOMPAT_") + spec.suffix, &unused)) return true;
  return spec.horovod_alias &&
         ProcessEnvironment()(std::string("HOROVOD_") + spec.suffix, &unused);
}

bool ParseKnobBool(const KnobSpec& spec, const std::string& value, const std::string& source) {
  std::string v = Lower(value);
  if (v.empty() || v == "0" || v == "false" || v == "no" || v == "off") return false;
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  BadValue(spec, value, source, "0/1, true/false, yes/no or on/off");
}

double ParseKnobNumber(const KnobSpec& spec, const std::string& value, const std::string& source) {
  // An empty value is the default (set but empty counts as unset, as the launchers read it).
  std::string v = value.empty() ? std::string(spec.default_value) : value;
  try {
    size_t used = 0;
    // Accept "1e6"-style values too: some launch scripts write thresholds so.
    double d = std::stod(v, &used);
    if (used != v.size() || d < 0) BadValue(spec, value, source, "a non-negative number");
    return d;
  } catch (const std::logic_error&) {
    BadValue(spec, value, source, "a non-negative number");
  }
}

std::string ParseKnobChoice(const KnobSpec& spec, const std::string& value,
                            const std::string& source) {
  std::string v = Lower(value.empty() ? std::string(spec.default_value) : value);
  const std::vector<std::string> choices = Choices(spec);
  std::string listed;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (Lower(choices[i]) == v) return choices[i];
    listed += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  }
  BadValue(spec, value, source, listed);
}

int64_t KnobInt(Knob knob) { return static_cast<int64_t>(KnobDouble(knob)); }

double KnobDouble(Knob knob) {
  std::string source;
  std::string v = KnobString(knob, &source);
  return ParseKnobNumber(SpecOf(knob), v, source);
}

bool KnobBool(Knob knob) {
  std::string source;
  std::string v = KnobString(knob, &source);
  return ParseKnobBool(SpecOf(knob), v, source);
}

std::string KnobChoice(Knob knob) {
  std::string source;
  std::string v = KnobString(knob, &source);
  return ParseKnobChoice(SpecOf(knob), v, source);
}

Config Config::FromEnvironment() {
  Config c;
  c.fusion_threshold_bytes = KnobInt(Knob::kFusionThreshold);
  c.cycle_time_ms = KnobDouble(Knob::kCycleTimeMs);
  c.cache_capacity = KnobInt(Knob::kCacheCapacity);
  c.stall_check_seconds =
      KnobBool(Knob::kStallCheckDisable) ? 0.0 : KnobDouble(Knob::kStallCheckTimeSeconds);
  c.stall_shutdown_seconds = KnobDouble(Knob::kStallShutdownTimeSeconds);
  c.shutdown_timeout_seconds = KnobDouble(Knob::kShutdownTimeoutSeconds);
  c.timeline_path = KnobString(Knob::kTimeline);
  c.timeline_mark_cycles = KnobBool(Knob::kTimelineMarkCycles);
  c.fusion_chunk_bytes = KnobInt(Knob::kFusionChunkBytes);
  if (c.fusion_chunk_bytes < 4096) c.fusion_chunk_bytes = 4096;
  c.inplace_min_bytes = KnobInt(Knob::kInPlaceMinBytes);
  c.max_call_bytes = std::max<int64_t>(4096, KnobInt(Knob::kMaxCallBytes));
  c.output_pool_bytes = KnobInt(Knob::kOutputPoolBytes);
  c.poll_spin_micros = KnobInt(Knob::kPollSpinMicros);
  c.poll_max_sleep_micros = KnobInt(Knob::kPollMaxSleepMicros);
  c.poll_data_spin_micros = KnobInt(Knob::kPollDataSpinMicros);
  c.engine_slice_micros = KnobInt(Knob::kEngineSliceMicros);
  c.num_nccl_streams = std::max<int64_t>(1, KnobInt(Knob::kNumNcclStreams));
  c.hierarchical_allreduce = KnobBool(Knob::kHierarchicalAllreduce);
  c.hierarchical_allgather = KnobBool(Knob::kHierarchicalAllgather);
  c.hierarchical_local_size = KnobInt(Knob::kHierarchicalLocalSize);
  c.hierarchical_allreduce_set = KnobExplicit(Knob::kHierarchicalAllreduce);
  c.async_completion = KnobBool(Knob::kEnableAsyncCompletion);
  c.link_plan = KnobChoice(Knob::kLinkPlan);
  c.network_segment_bytes = std::max<int64_t>(4096, KnobInt(Knob::kNetworkSegmentBytes));
  c.network_pipeline_depth = std::max<int64_t>(1, KnobInt(Knob::kNetworkPipelineDepth));
  c.network_16bit_wire = KnobBool(Knob::kNetwork16BitWire);
  c.gloo_segment_bytes = std::max<int64_t>(4096, KnobInt(Knob::kGlooSegmentBytes));
  c.gloo_pipeline_depth = std::max<int64_t>(1, KnobInt(Knob::kGlooPipelineDepth));
  c.gloo_exchange_max_bytes = std::max<int64_t>(0, KnobInt(Knob::kGlooExchangeMaxBytes));
  std::string ops = KnobChoice(Knob::kGpuOperations);
  c.gpu_operations_mpi = ops == "MPI" || ops == "GLOO";
  c.autotune = KnobBool(Knob::kAutotune);
  c.autotune_log = KnobString(Knob::kAutotuneLog);
  c.autotune_warmup_samples = KnobInt(Knob::kAutotuneWarmupSamples);
  c.autotune_steps_per_sample = KnobInt(Knob::kAutotuneStepsPerSample);
  c.autotune_bayes_opt_max_samples = KnobInt(Knob::kAutotuneBayesOptMaxSamples);
  c.autotune_gaussian_process_noise = KnobDouble(Knob::kAutotuneGaussianProcessNoise);
  {
    std::string source;
    std::string list = KnobString(Knob::kThreadAffinity, &source);
    size_t start = 0;
    while (list.find_first_not_of(" \t") != std::string::npos && start <= list.size()) {
      size_t comma = list.find(',', start);
      std::string item = list.substr(start, comma == std::string::npos ? std::string::npos
                                                                        : comma - start);
      size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
      item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
      char* end = nullptr;
      long core = item.empty() ? -1 : std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || core < 0 || core >= CPU_SETSIZE) {
        BadValue(Knob::kThreadAffinity, list, source,
                 "comma-separated core numbers, one per local rank, e.g. 0,1,2,3");
      }
      c.thread_affinity.push_back(static_cast<int>(core));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  // Checked here, on every rank alike, so a bad value fails every rank's init.
  for (Knob k : {Knob::kAutotuneStepsPerSample, Knob::kAutotuneBayesOptMaxSamples}) {
    if (KnobInt(k) < 1) {
      std::string source;
      std::string v = KnobString(k, &source);
      BadValue(k, v, source, "an integer of at least 1");
    }
  }
  return c;
}

}  // namespace hvdcompat

namespace hvdcompat {

int WorkerCoreFor(const std::vector<int>& thread_affinity, int local_rank, int local_size) {
  if (thread_affinity.empty()) return -1;
  std::string source;
  std::string list = KnobString(Knob::kThreadAffinity, &source);
  // More cores than local ranks is fine: after an elastic reset a host may run fewer.
  if (static_cast<int>(thread_affinity.size()) < local_size) {
    throw InvalidArgument(
        "hvd.init(): " + source + "=" + list + " lists " + std::to_string(thread_affinity.size()) +
        " core(s) but this host runs " + std::to_string(local_size) +
        " rank(s); give one core per local rank (local rank i's engine threads run on the i-th), "
        "or unset it.");
  }
  int core = thread_affinity[local_rank];
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && !CPU_ISSET(core, &allowed)) {
    std::string cores;
    for (int i = 0; i < CPU_SETSIZE; ++i) {
      if (CPU_ISSET(i, &allowed)) cores += (cores.empty() ? "" : ",") + std::to_string(i);
    }
    throw InvalidArgument("hvd.init(): " + source + "=" + list + " gives local rank " +
                          std::to_string(local_rank) + " core " + std::to_string(core) +
                          ", which this process may not run on (allowed: " + cores +
                          "); choose cores from that set.");
  }
  return core;
}

bool PinCurrentThread(int core) {
  if (core < 0) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

bool RequestSchedulerSlice(int64_t micros) {
#if defined(__linux__) && defined(SYS_sched_setattr) && defined(SYS_gettid)
  if (micros <= 0) return true;
  if (sched_getscheduler(0) != SCHED_OTHER) return true;  // the user's policy stays
  // struct sched_attr (linux/sched/types.h), which the C library does not declare.
  struct SchedAttr {
    uint32_t size;
    uint32_t policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime;  // for SCHED_OTHER: the slice, in ns (Linux 6.12 and later)
    uint64_t deadline;
    uint64_t period;
  };
  SchedAttr attr{};
  attr.size = sizeof(attr);
  attr.policy = SCHED_OTHER;
  // The call sets the nice value too: keep the thread's own.
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  if (errno != 0) return false;
  attr.nice = nice;
  attr.runtime = static_cast<uint64_t>(micros) * 1000;
  return syscall(SYS_sched_setattr, 0, &attr, 0) == 0;
#else
  (void)micros;
  return true;
#endif
}

}  // namespace hvdcompat
