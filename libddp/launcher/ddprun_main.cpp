// ddprun: starts a distributed training job the way torchrun does.

#include <cstdio>
#include <exception>

#include "launcher/doctor.h"
#include "launcher/launch_options.h"
#include "launcher/supervisor.h"

int main(int argc, char** argv) {
  using namespace ddp::launcher;
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "--doctor") return run_doctor(args);
  LaunchOptions options;
  try {
    bool help = false;
    options = parse_launch_options(args, help);
    if (help) {
      std::fputs(usage().c_str(), stdout);
      return 0;
    }
  } catch (const LaunchUsageError& e) {
    std::fprintf(stderr, "ddprun: error: %s\n\n%s", e.what(), usage().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: error: %s\n", e.what());
    return 2;
  }
  try {
    return supervise(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
