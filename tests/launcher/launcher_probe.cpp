// A stand-in worker for the ddprun tests: reports what ddprun gave it and
// behaves as the test asks (fails, sleeps, prints).
//   launcher_probe env DIR                  writes its environment to DIR/env_<restart>_<rank>
//   launcher_probe sleep DIR                writes DIR/pid_<rank>, then sleeps 60 s
//   launcher_probe fail-rank R DIR          as sleep; rank R fails once every local rank has a pid file
//   launcher_probe fail-before-restart N DIR  writes its environment; while the restart
//                                           count is below N, rank 0 fails and the others sleep
//   launcher_probe talk                     one line to stdout and one to stderr

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

extern char** environ;

namespace {

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

int env_int(const char* name) { return std::atoi(variable(name).c_str()); }

/// Written under a temporary name and renamed, so a reader never sees half a file.
void write_file(const std::string& path, const std::string& text) {
  const std::string partial = path + ".partial";
  std::ofstream(partial) << text;
  std::filesystem::rename(partial, path);
}

void write_environment(const std::string& dir) {
  std::string text;
  for (char** entry = environ; *entry != nullptr; ++entry) text += std::string(*entry) + "\n";
  write_file(dir + "/env_" + variable("TORCHELASTIC_RESTART_COUNT") + "_" + variable("RANK"), text);
}

[[noreturn]] void sleep_and_exit() {
  std::this_thread::sleep_for(std::chrono::seconds(60));
  std::exit(0);
}

void write_pid(const std::string& dir) {
  write_file(dir + "/pid_" + variable("RANK"), std::to_string(::getpid()));
}

[[noreturn]] void fail(int code) {
  std::fprintf(stderr, "probe: error: rank %s failing on purpose (restart count %s)\n", variable("RANK").c_str(),
               variable("TORCHELASTIC_RESTART_COUNT").c_str());
  std::exit(code);
}

/// Waits until every local rank has written its file `prefix<rank>` to DIR,
/// so that a failure stops workers that run rather than ones still starting.
void wait_for_local_ranks(const std::string& dir, const std::string& prefix) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  const int first = env_int("GROUP_RANK") * env_int("LOCAL_WORLD_SIZE");
  for (int rank = first; rank < first + env_int("LOCAL_WORLD_SIZE"); ++rank) {
    while (!std::filesystem::exists(dir + "/" + prefix + std::to_string(rank)) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "env" && argc == 3) {
    write_environment(argv[2]);
    return 0;
  }
  if (mode == "sleep" && argc == 3) {
    write_pid(argv[2]);
    sleep_and_exit();
  }
  if (mode == "fail-rank" && argc == 4) {
    const std::string dir = argv[3];
    write_pid(dir);
    if (env_int("RANK") != std::atoi(argv[2])) sleep_and_exit();
    wait_for_local_ranks(dir, "pid_");
    fail(3);
  }
  if (mode == "fail-before-restart" && argc == 4) {
    write_environment(argv[3]);
    if (env_int("TORCHELASTIC_RESTART_COUNT") >= std::atoi(argv[2])) return 0;
    if (env_int("RANK") == 0) {
      wait_for_local_ranks(argv[3], "env_" + variable("TORCHELASTIC_RESTART_COUNT") + "_");
      fail(3);
    }
    sleep_and_exit();
  }
  if (mode == "talk" && argc == 2) {
    std::printf("out line from rank %s\n", variable("RANK").c_str());
    std::fprintf(stderr, "err line from rank %s\n", variable("RANK").c_str());
    return 0;
  }
  std::fprintf(stderr, "launcher_probe: unknown mode or wrong arguments; see the comment at the top of the source\n");
  return 64;
}
