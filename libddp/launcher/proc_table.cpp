#include "launcher/proc_table.h"

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ddp::launcher {

std::optional<ProcessEntry> read_process(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return std::nullopt;
  // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, the last ')' ends it.
  const auto end = stat.rfind(')');
  if (end == std::string::npos || end + 2 > stat.size()) return std::nullopt;
  std::istringstream fields(stat.substr(end + 2));
  ProcessEntry entry;
  entry.pid = pid;
  std::string skip;
  fields >> skip >> entry.parent;  // fields 3 (state) and 4 (ppid)
  for (int field = 5; field < 22; ++field) fields >> skip;
  fields >> entry.start;  // field 22
  if (!fields) return std::nullopt;
  return entry;
}

std::vector<ProcessEntry> all_processes() {
  std::vector<ProcessEntry> found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (const dirent* item = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(item->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    if (auto entry = read_process(static_cast<pid_t>(pid))) found.push_back(*entry);
  }
  ::closedir(proc);
  return found;
}

}  // namespace ddp::launcher
