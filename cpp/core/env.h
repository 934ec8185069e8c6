// Every tunable of the core, declared once: name, Horovod alias, default and
// meaning. HVDCOMPAT_<NAME> wins over HOROVOD_<NAME> when both are set.
// Values are read when the runtime initialises (Config::FromEnvironment), so
// a shutdown -> change env -> init cycle picks up new values.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hvdcompat {

enum class Knob : int {
  kFusionThreshold,
  kCycleTimeMs,
  kCacheCapacity,
  kStallCheckTimeSeconds,
  kStallShutdownTimeSeconds,
  kShutdownTimeoutSeconds,
  kInitTimeoutSeconds,
  kStallCheckDisable,
  kTimeline,
  kTimelineMarkCycles,
  kLogLevel,
  kLogHideTime,
  kNumNcclStreams,
  kHierarchicalAllreduce,
  kGpuOperations,
  kDynamicProcessSets,
  kFusionChunkBytes,
  kInPlaceMinBytes,
  kMaxCallBytes,
  kOutputPoolBytes,
  kPollSpinMicros,
  kPollMaxSleepMicros,
  kPollDataSpinMicros,
  kEngineSliceMicros,
  kEnableAsyncCompletion,
  kNcclLib,
  kCudartLib,
  kHierarchicalLocalSize,
  kAutotune,
  kAutotuneLog,
  kAutotuneWarmupSamples,
  kAutotuneStepsPerSample,
  kAutotuneBayesOptMaxSamples,
  kAutotuneGaussianProcessNoise,
  kHierarchicalAllgather,
  kLinkPlan,
  kNetworkSegmentBytes,
  kNetworkPipelineDepth,
  kNetwork16BitWire,
  kGlooSegmentBytes,
  kGlooPipelineDepth,
  kGlooExchangeMaxBytes,
  kElasticMinNp,
  kElasticResetLimit,
  kElasticDir,
  kElasticHost,
  kElasticJoin,
  kThreadAffinity,
  kWaitSpinMicros,
  kElastic,
  kDdpAccelerate,
  kDdpCompression,
  kDdpRoute,
  kDdpFusionThreshold,
  kStartTimeout,
  kGlooTimeoutSeconds,
  kMpirun,
  kController,
  kReportFd,
  kGlooPeerTimeoutSeconds,
  kCount,
};

struct KnobSpec {
  Knob knob;
  const char* suffix;         // e.g. "FUSION_THRESHOLD"
  bool horovod_alias;         // also read as HOROVOD_<suffix>
  const char* default_value;  // as a string, parsed like the env value
  const char* unit;
  const char* help;           // one line
};

const std::vector<KnobSpec>& AllKnobs();
const KnobSpec& SpecOf(Knob knob);

// What a knob's value is, from its unit: "bool"; a choice ("NCCL|MPI"); a whole or a
// fractional number; or text (a path, a name, a list). Every reader, the engine's and
// Python's (_core.setting), parses a knob by its kind with the rules below.
enum class KnobKind { kBool, kInt, kFloat, kChoice, kText };
KnobKind KindOf(const KnobSpec& spec);
const char* KindName(KnobKind kind);

// Finds an environment variable: true and its value when it is set. ProcessEnvironment()
// reads this process's; the launcher passes the environment it builds for its ranks.
using EnvLookup = std::function<bool(const std::string& name, std::string* value)>;
const EnvLookup& ProcessEnvironment();

// The one reader: HVDCOMPAT_<suffix>, then HOROVOD_<suffix> (for knobs with the alias),
// then the default; `source` says which, for messages.
std::string KnobRaw(const KnobSpec& spec, const EnvLookup& env, std::string* source);
// The rules of each kind (InvalidArgument, naming the variable, for a bad value):
//   bool:   "", 0, false, no, off are false; 1, true, yes, on are true (any case);
//   number: a non-negative decimal ("1e6" too); an int knob drops the fraction;
//   choice: one of the unit's spellings, any case, returned as the unit spells it;
//           "" is the default;
//   text:   the value as it is.
bool ParseKnobBool(const KnobSpec& spec, const std::string& value, const std::string& source);
double ParseKnobNumber(const KnobSpec& spec, const std::string& value, const std::string& source);
std::string ParseKnobChoice(const KnobSpec& spec, const std::string& value,
                            const std::string& source);

// Raw string value (HVDCOMPAT_ first, then HOROVOD_, then the default) and
// the name it came from, for error messages.
std::string KnobString(Knob knob, std::string* source = nullptr);
int64_t KnobInt(Knob knob);
double KnobDouble(Knob knob);
bool KnobBool(Knob knob);
std::string KnobChoice(Knob knob);
// Whether the environment sets the knob (either spelling), as opposed to its
// default applying: the autotuner leaves such knobs as the user chose.
bool KnobExplicit(Knob knob);

// Snapshot of the tunables the engine uses, taken at init.
struct Config {
  int64_t fusion_threshold_bytes;  // 0 disables fusion
  double cycle_time_ms;            // batching window after a wake-up
  int64_t cache_capacity;          // 0 disables the response cache
  double stall_check_seconds;      // <= 0 or disabled: no stall warnings
  double stall_shutdown_seconds;   // 0: never fail stalled ops
  double shutdown_timeout_seconds; // shutdown ends a wait on a stopped peer after this; 0: never
  std::string timeline_path;       // empty: no timeline; "DYNAMIC": start later
  bool timeline_mark_cycles;
  int64_t fusion_chunk_bytes;      // pipeline chunk of pack/reduce/unpack
  int64_t inplace_min_bytes;       // tensors this large skip the fusion copy
  int64_t max_call_bytes;          // larger direct reductions are split into calls of this size
  int64_t output_pool_bytes;       // host outputs kept for reuse (hvdcompat/ops/_pool.py); 0: none
  int64_t poll_spin_micros;        // busy-poll before sleeping while waiting
  int64_t poll_max_sleep_micros;   // cap of the sleep back-off while waiting
  int64_t poll_data_spin_micros;   // data collectives: test back to back this long before sleeping
  int64_t engine_slice_micros;     // scheduler slice of the engine's threads; 0: the default
  int64_t num_nccl_streams;        // GPU lanes (stream + communicator each), >= 1
  bool hierarchical_allreduce;     // allreduce in three steps over node/cross comms (CPU and GPU)
  bool hierarchical_allgather;     // host allgather in three steps over node/cross comms
  int64_t hierarchical_local_size; // ranks per node for those splits (testing); 0: shared memory
  bool hierarchical_allreduce_set; // HOROVOD_HIERARCHICAL_ALLREDUCE given (else the link plan picks)
  std::string link_plan;           // "auto", "host" or "network" (Note [Link plans])
  int64_t network_segment_bytes;   // network plan: pipelined segment size
  int64_t network_pipeline_depth;  // network plan: segments in flight, >= 1
  bool network_16bit_wire;         // network plan: float16/bfloat16 cross as 16 bits
  int64_t gloo_segment_bytes;      // Gloo ring allreduce: largest segment
  int64_t gloo_pipeline_depth;     // Gloo ring allreduce: receives posted ahead, >= 1
  int64_t gloo_exchange_max_bytes; // Gloo allreduce: payloads up to this go in one exchange
  bool gpu_operations_mpi;         // CUDA buffers go through host memory and the
                                   // controller's host backend (MPI or GLOO)
  bool async_completion;           // synchronize() orders streams, does not wait on the host
  bool autotune;                   // search the tunables while training (parameter_manager.h)
  std::string autotune_log;        // CSV of every configuration scored; empty: none
  int64_t autotune_warmup_samples;     // scores discarded before the search
  int64_t autotune_steps_per_sample;   // steps per sample
  int64_t autotune_bayes_opt_max_samples;  // configurations the search scores
  double autotune_gaussian_process_noise;  // surrogate model's noise, in score sds
  // HOROVOD_THREAD_AFFINITY: one core per local rank (empty: not pinned).
  std::vector<int> thread_affinity;
  // Not a knob: the core this rank's engine threads run on (-1: anywhere),
  // chosen from thread_affinity once the local rank is known.
  int worker_core = -1;
  // Not a knob: each rank's host name (index: rank in the job), filled once the
  // MPI world is known, so failures can say where a lost rank ran.
  std::vector<std::string> rank_hosts;

  static Config FromEnvironment();
};

// The core of `thread_affinity` for `local_rank` (-1 when the list is
// empty). Throws InvalidArgument, naming the variable and what to set, when
// the list has fewer cores than local ranks or names a core this process may
// not run on.
int WorkerCoreFor(const std::vector<int>& thread_affinity, int local_rank, int local_size);

// Pins the calling thread to `core` (no-op for -1); false when the OS refused.
bool PinCurrentThread(int core);

// Note [Engine thread slice]
// The engine's threads do short bursts of work (a negotiation round, one
// step of MPI's progress) on cores that the training threads keep busy, and
// the peers wait for each burst. Linux's EEVDF scheduler (6.6 and later)
// runs a woken thread at once only when its virtual deadline comes before
// the running thread's, and the deadline is one slice after the thread's
// start: with the default slice (1.4 ms on a 2-core machine, longer with
// more cores) a woken engine thread often waits for the training thread's
// slice to end. Since Linux 6.12 a
// thread may ask for a shorter slice (sched_setattr's sched_runtime for
// SCHED_OTHER): it is not given more CPU time, only an earlier deadline, so
// it preempts on wake-up and gives the core back soon after.
// HVDCOMPAT_ENGINE_SLICE_MICROS (100 us, the kernel's minimum) is what the
// worker threads ask for; older kernels ignore the request, and a thread
// whose policy is not SCHED_OTHER (set by the user) is left alone.
//
// Asks the scheduler for a slice of `micros` for the calling thread
// (Note [Engine thread slice]); no-op for micros <= 0. False when the OS
// refused.
bool RequestSchedulerSlice(int64_t micros);

}  // namespace hvdcompat
