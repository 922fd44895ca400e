#include "flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

namespace examples {

Flags::Flags(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}

Flags& Flags::add(const std::string& name, const std::string& default_value, const std::string& help) {
  order_.push_back(name);
  flags_[name] = Flag{default_value, help, false, false};
  return *this;
}

Flags& Flags::add_switch(const std::string& name, const std::string& help) {
  order_.push_back(name);
  flags_[name] = Flag{"false", help, true, false};
  return *this;
}

std::string Flags::usage() const {
  std::string text = fmt::format("usage: {} [flags]\n\n{}\n\nflags:\n", program_, summary_);
  for (const auto& name : order_) {
    const Flag& flag = flags_.at(name);
    const std::string left = flag.is_switch ? "--" + name : fmt::format("--{} VALUE", name);
    text += fmt::format("  {:<28} {}", left, flag.help);
    if (!flag.is_switch && !flag.value.empty()) text += fmt::format(" (default {})", flag.value);
    text += "\n";
  }
  return text;
}

void Flags::fail(const std::string& message) const {
  std::fprintf(stderr, "%s: error: %s\n\n%s", program_.c_str(), message.c_str(), usage().c_str());
  std::exit(2);
}

void Flags::parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage().c_str(), stdout);
      std::exit(0);
    }
    if (arg.rfind("--", 0) != 0) fail(fmt::format("unexpected argument '{}'", arg));
    std::string name = arg.substr(2);
    std::string value;
    const bool inline_value = name.find('=') != std::string::npos;
    if (inline_value) {
      value = name.substr(name.find('=') + 1);
      name = name.substr(0, name.find('='));
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) fail(fmt::format("unknown flag '--{}'", name));
    Flag& flag = it->second;
    if (flag.is_switch) {
      if (inline_value) fail(fmt::format("--{} takes no value", name));
      value = "true";
    } else if (!inline_value) {
      if (i + 1 >= argc) fail(fmt::format("--{} needs a value", name));
      value = argv[++i];
    }
    flag.value = value;
    flag.given = true;
  }
}

const Flags::Flag& Flags::find(const std::string& name) const {
  auto it = flags_.find(name);
  if (it == flags_.end()) throw std::logic_error("flag --" + name + " was never declared");
  return it->second;
}

const std::string& Flags::str(const std::string& name) const { return find(name).value; }

std::int64_t Flags::integer(const std::string& name) const {
  const std::string& text = str(name);
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE) fail(fmt::format("--{} expects an integer, got '{}'", name, text));
  return value;
}

double Flags::real(const std::string& name) const {
  const std::string& text = str(name);
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') fail(fmt::format("--{} expects a number, got '{}'", name, text));
  return value;
}

double Flags::real_in(const std::string& name, double low, double high, bool high_open) const {
  const double value = real(name);
  if (!std::isfinite(value) || value < low || value > high || (high_open && value == high)) {
    fail(fmt::format("--{} must be a finite number in [{}, {}{}, got {}", name, low, high, high_open ? ")" : "]",
                     str(name)));
  }
  return value;
}

bool Flags::on(const std::string& name) const { return str(name) == "true"; }

bool Flags::given(const std::string& name) const { return find(name).given; }

}  // namespace examples
