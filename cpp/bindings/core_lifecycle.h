#pragma once

#include <vector>

#include "engine/runtime.h"

namespace hvdcompat {

// hvd.init(): starts the runtime (a second call while one runs is harmless).
void CoreInit(InitOptions opts);
// Stops the runtime; calls still inside it fail with its shutdown error first.
void CoreShutdown();
// Note [Elastic reset] (engine/elastic_reset.h): rebuilds the runtime from the
// surviving ranks; their ranks in the old world, in new-rank order.
std::vector<int> CoreElasticReset();
// This process leaves the elastic job (its host was removed by discovery): on
// Gloo the others' next reset does not wait for it (Note [Elastic reset on
// Gloo]); returns once they agreed on their world, or after the Gloo timeout.
void CoreElasticLeave();
// Shuts down and, when hvdcompat initialised MPI (and not under ULFM), finalizes it.
void CoreFinalize();
bool CoreIsInitialized();

}  // namespace hvdcompat
