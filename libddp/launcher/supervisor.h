#pragma once

#include "launcher/launch_options.h"

namespace ddp::launcher {

/// Starts the workers, relays their output with a rank prefix, stops them all
/// when one fails or ddprun is signalled, and prints a summary. Returns
/// ddprun's exit code: 0 when every worker exited 0.
int supervise(const LaunchOptions& options);

}  // namespace ddp::launcher
