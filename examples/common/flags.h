#pragma once

// Command-line flags of the example programs: --name value or --name=value,
// declared with a default and a help line; bad input exits with code 2 and
// the usage, as ddprun does.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace examples {

class Flags {
 public:
  Flags(std::string program, std::string summary);

  /// Declares a flag taking a value. `default_value` "" means none.
  Flags& add(const std::string& name, const std::string& default_value, const std::string& help);
  /// Declares a switch (present: true).
  Flags& add_switch(const std::string& name, const std::string& help);

  /// Parses argv; on --help prints the usage and exits 0, on bad input prints
  /// what was wrong and the usage and exits 2.
  void parse(int argc, char** argv);

  const std::string& str(const std::string& name) const;
  std::int64_t integer(const std::string& name) const;
  double real(const std::string& name) const;
  /// real(name), which must be finite and in [low, high] (high excluded
  /// when `high_open`); else fail().
  double real_in(const std::string& name, double low, double high, bool high_open) const;
  bool on(const std::string& name) const;
  /// Whether the user gave the flag (as opposed to its default).
  bool given(const std::string& name) const;
  /// Every flag's name, in the order declared.
  const std::vector<std::string>& names() const { return order_; }

  /// Prints `message` and the usage, exits 2: for checks across flags.
  [[noreturn]] void fail(const std::string& message) const;

 private:
  struct Flag {
    std::string value;
    std::string help;
    bool is_switch = false;
    bool given = false;
  };
  const Flag& find(const std::string& name) const;
  std::string usage() const;

  std::string program_;
  std::string summary_;
  std::vector<std::string> order_;
  std::map<std::string, Flag> flags_;
};

}  // namespace examples
