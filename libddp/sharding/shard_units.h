#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}

namespace ddp::detail {

/// The units of Sharding::kFull: the modules that shard_units() names, each
/// gathered whole only while it runs.
struct ShardUnits {
  std::vector<std::string> names;                   ///< Per unit, its module path ("layers.3").
  std::vector<const torch::nn::Module*> modules;    ///< Per unit.
  /// Per trained parameter, its unit, or -1: outside every unit (kept gathered).
  std::vector<int> unit_of_parameter;
};

/// Matches `patterns` against the module paths under `root`: '*' stands for
/// any characters but '.', so "layers.*" names each block of a list. A
/// module inside a unit is part of it, not a unit of its own. A parameter
/// registered in two units (tied) belongs to none. UsageError for a pattern
/// that matches nothing, or a unit whose parameters differ in dtype.
ShardUnits find_shard_units(const torch::nn::Module& root, const std::vector<at::Tensor>& trained,
                            const std::vector<std::string>& patterns);

/// The buckets of Sharding::kFull, in reduction order (the parameters in
/// reverse registration order): each unit's trained parameters in one
/// bucket, and the parameters outside units in buckets of the usual caps,
/// never spanning a unit, so that no unit's reduction waits for a bucket of
/// parameters used earlier in forward. Returns, per bucket, indices into
/// `trained`; `unit_of_bucket` gets each bucket's unit (or -1).
std::vector<std::vector<std::size_t>> unit_buckets(const std::vector<at::Tensor>& trained, const ShardUnits& units,
                                                   std::size_t first_cap_bytes, std::size_t cap_bytes,
                                                   std::vector<int>& unit_of_bucket);

}  // namespace ddp::detail
