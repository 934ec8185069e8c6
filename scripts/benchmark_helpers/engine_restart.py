"""Engine restarts for the benchmarks' --autotune comparisons (a helper, not an example).

The engine reads its knobs at ``hvd.init()``, so comparing the default engine
with a tuned one means shutting it down and starting it again on another
environment. Both benchmarks time the default and the tuned engine in turns.
"""

import os

import hvdcompat as hvd

__all__ = ["TUNED_KNOBS", "AUTOTUNE_KNOBS", "restart"]

# The knobs the autotuner searches, and the engine_stats() keys that report them.
TUNED_KNOBS = {"HVDCOMPAT_FUSION_THRESHOLD": "fusion_threshold_bytes",
               "HVDCOMPAT_CYCLE_TIME": "cycle_time_ms",
               "HVDCOMPAT_FUSION_CHUNK_BYTES": "fusion_chunk_bytes",
               "HVDCOMPAT_MAX_CALL_BYTES": "max_call_bytes"}
AUTOTUNE_KNOBS = ("HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
                  "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
                  "HOROVOD_AUTOTUNE_LOG")


def restart(launch_env, **env):
    """Restarts the engine on the launch's environment plus `env` (knobs are read at init).

    Args:
        launch_env: {name: value or None} as the job was launched; None removes the variable.
        **env: variables to set on top of it for the new engine.
    """
    hvd.shutdown()
    for k, v in launch_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    os.environ.update(env)
    hvd.init()
