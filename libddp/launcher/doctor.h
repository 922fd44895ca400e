#pragma once

#include <string>
#include <vector>

#include "launcher/doctor_checks.h"

namespace ddp::launcher {

/// ddprun --doctor [--json]: the host checks, then a real job of one worker
/// per visible GPU (2 CPU workers without) that runs the probe next to
/// ddprun (versions, peer access, an all-reduce's bandwidth). Prints one
/// screen (or one JSON object) and returns 1 if something would stop a job,
/// 2 for bad arguments, else 0.
int run_doctor(const std::vector<std::string>& args);

/// The report as text or as JSON: {"ok", "failures", "warnings", "checks": [{"status", "name", "detail", "fix"}]}.
std::string render_report(const std::vector<Check>& checks, bool json);

/// Reads the probe's report: one check per line, "status<TAB>name<TAB>detail<TAB>fix".
std::vector<Check> parse_probe_report(const std::string& text);

}  // namespace ddp::launcher
