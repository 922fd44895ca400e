#pragma once

// What the example trainers' --metrics logs (JSON lines) say, read back.

#include <fstream>
#include <map>
#include <regex>
#include <string>

namespace examples::testing {

/// step -> loss from a metrics log; a step logged twice (a restarted run
/// repeats the steps after its checkpoint) keeps the later value.
inline std::map<int, double> losses(const std::string& metrics_path) {
  std::ifstream file(metrics_path);
  std::map<int, double> result;
  const std::regex line_pattern(R"re(^\{"step": (\d+), "loss": ([-0-9.e+naif]+))re");
  for (std::string line; std::getline(file, line);) {
    std::smatch match;
    if (std::regex_search(line, match, line_pattern)) result[std::stoi(match[1])] = std::stod(match[2]);
  }
  return result;
}

}  // namespace examples::testing
