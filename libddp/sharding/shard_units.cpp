#include "sharding/shard_units.h"

#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

#include <ddp/errors.h>

#include "reducer/bucket_assignment.h"

namespace ddp::detail {
namespace {

/// Whether `name` matches `pattern`, '*' matching any run of characters but '.'.
bool matches(const char* pattern, const char* name) {
  if (*pattern == '\0') return *name == '\0';
  if (*pattern == '*') {
    for (const char* rest = name;; ++rest) {
      if (matches(pattern + 1, rest)) return true;
      if (*rest == '\0' || *rest == '.') return false;
    }
  }
  return *pattern == *name && matches(pattern + 1, name + 1);
}

bool inside(const std::string& name, const std::string& unit) {
  return name.size() > unit.size() && name.compare(0, unit.size(), unit) == 0 && name[unit.size()] == '.';
}

}  // namespace

ShardUnits find_shard_units(const torch::nn::Module& root, const std::vector<at::Tensor>& trained,
                            const std::vector<std::string>& patterns) {
  std::vector<std::string> module_names;
  std::vector<std::string> unit_names;
  std::vector<const torch::nn::Module*> unit_modules;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    module_names.push_back(item.key());
    bool named = false;
    for (const auto& pattern : patterns) named = named || matches(pattern.c_str(), item.key().c_str());
    bool nested = false;
    for (const auto& unit : unit_names) nested = nested || inside(item.key(), unit);
    if (!named || nested) continue;
    unit_names.push_back(item.key());
    unit_modules.push_back(item.value().get());
  }
  for (const auto& pattern : patterns) {
    bool used = false;
    for (const auto& name : module_names) used = used || matches(pattern.c_str(), name.c_str());
    if (!used) {
      module_names.resize(std::min<std::size_t>(module_names.size(), 8));
      throw UsageError(fmt::format("libddp: shard_units pattern '{}' matches no submodule of the model ('*' stands "
                                   "for one path segment); the module paths begin: {}",
                                   pattern, fmt::join(module_names, ", ")));
    }
  }

  // A parameter belongs to a unit if every name it is registered under lies
  // in that unit; one tied across units, or to a module outside them, is used
  // outside the unit and must stay gathered.
  std::unordered_map<const c10::TensorImpl*, std::size_t> index_of;
  for (std::size_t i = 0; i < trained.size(); ++i) index_of[trained[i].unsafeGetTensorImpl()] = i;
  constexpr int kUnseen = -2;
  std::vector<int> owner(trained.size(), kUnseen);
  for (const auto& item : root.named_parameters()) {
    auto it = index_of.find(item.value().unsafeGetTensorImpl());
    if (it == index_of.end()) continue;  // frozen: stays whole, as in every mode
    int unit = -1;
    for (std::size_t u = 0; u < unit_names.size(); ++u) {
      if (inside(item.key(), unit_names[u])) unit = static_cast<int>(u);
    }
    int& current = owner[it->second];
    current = current == kUnseen || current == unit ? unit : -1;
  }

  // Units with no trained parameter of their own have nothing to gather.
  ShardUnits units;
  std::vector<int> renumbered(unit_names.size(), -1);
  for (std::size_t u = 0; u < unit_names.size(); ++u) {
    std::vector<std::size_t> members;
    for (std::size_t i = 0; i < trained.size(); ++i) {
      if (owner[i] == static_cast<int>(u)) members.push_back(i);
    }
    if (members.empty()) continue;
    for (std::size_t member : members) {
      if (trained[member].scalar_type() != trained[members.front()].scalar_type()) {
        throw UsageError(fmt::format("libddp: shard unit '{}' has parameters of dtypes {} and {}; a unit is gathered "
                                     "as one flat buffer, so name units whose parameters share one dtype",
                                     unit_names[u], c10::toString(trained[members.front()].scalar_type()),
                                     c10::toString(trained[member].scalar_type())));
      }
    }
    renumbered[u] = static_cast<int>(units.names.size());
    units.names.push_back(unit_names[u]);
    units.modules.push_back(unit_modules[u]);
  }
  units.unit_of_parameter.assign(trained.size(), -1);
  for (std::size_t i = 0; i < trained.size(); ++i) {
    if (owner[i] >= 0) units.unit_of_parameter[i] = renumbered[owner[i]];
  }
  return units;
}

std::vector<std::vector<std::size_t>> unit_buckets(const std::vector<at::Tensor>& trained, const ShardUnits& units,
                                                   std::size_t first_cap_bytes, std::size_t cap_bytes,
                                                   std::vector<int>& unit_of_bucket) {
  std::vector<std::vector<std::size_t>> buckets;
  unit_of_bucket.clear();
  std::vector<std::vector<std::size_t>> members(units.names.size());
  for (std::size_t i = trained.size(); i-- > 0;) {
    if (units.unit_of_parameter[i] >= 0) members[units.unit_of_parameter[i]].push_back(i);
  }
  std::vector<std::uint8_t> emitted(units.names.size(), 0);
  std::vector<std::size_t> outside;  // a run of parameters outside units
  const auto close_run = [&] {
    if (outside.empty()) return;
    for (auto& bucket : assign_buckets(trained, outside, first_cap_bytes, cap_bytes)) {
      buckets.push_back(std::move(bucket));
      unit_of_bucket.push_back(-1);
    }
    outside.clear();
  };
  for (std::size_t i = trained.size(); i-- > 0;) {
    const int unit = units.unit_of_parameter[i];
    if (unit < 0) {
      outside.push_back(i);
      continue;
    }
    close_run();
    if (emitted[unit]) continue;
    emitted[unit] = 1;
    buckets.push_back(members[unit]);
    unit_of_bucket.push_back(unit);
  }
  close_run();
  return buckets;
}

}  // namespace ddp::detail
