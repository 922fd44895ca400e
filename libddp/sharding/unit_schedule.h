#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>

#include "sharding/shard_units.h"

namespace ddp::detail {

class ShardedParameters;

/// When each shard unit holds its gathered parameters, as FSDP's pre- and
/// post-forward and backward hooks decide it. (With kOptimizer and
/// kGradients units are resident: entering one only waits for the gather of
/// its bucket that the forward started, and the rest does nothing.) LibTorch's C++
/// modules have no forward hooks, so a unit announces its forward itself
/// (ddp::in_unit); its backward is announced by hooks on its outputs'
/// gradients, which autograd computes before any of the unit's backward.
///
/// Forward: a unit is gathered when it starts (the next one, in the order of
/// the previous forward, is prefetched on the communicator's stream) and
/// released when it ends, but for the last one, whose backward comes first.
/// Backward: a unit is gathered when its outputs' gradients arrive (the unit
/// before it prefetched), and released once all its parameters' gradients
/// are accumulated. Every collective is issued in unit order, the same on
/// every rank, as long as every rank runs the same units.
class UnitSchedule : public std::enable_shared_from_this<UnitSchedule> {
 public:
  /// `bucket_of_unit`: the sharded bucket holding each unit's parameters.
  UnitSchedule(std::shared_ptr<ShardedParameters> sharded, ShardUnits units, std::vector<std::size_t> bucket_of_unit);
  ~UnitSchedule();

  /// Makes the units findable by ddp::in_unit; call once, after construction.
  void register_units();
  /// The schedule of `module` and its unit; null if it is no unit.
  static std::shared_ptr<UnitSchedule> find(const void* module, std::size_t& unit);

  /// Before the module's forward: releases every unit (the optimizer may
  /// have stepped their shards). Until a forward has been checked it
  /// gathers every unit instead, so that a unit that runs outside in_unit
  /// works once and after_forward() can name it.
  void before_forward();
  /// After the module's forward. `used`: per trained parameter, whether the
  /// outputs depend on it (null: not known, as without grad mode); the
  /// first time it is given, a unit with used parameters that did not run
  /// through in_unit is a UsageError, and from then on units are gathered
  /// only while they run.
  void after_forward(const std::vector<std::uint8_t>* used);
  bool checked() const;
  void enter(std::size_t unit);
  void leave(std::size_t unit, const std::vector<at::Tensor>& outputs);
  /// The gradient of trained parameter `index` was accumulated.
  void gradient_ready(std::size_t index);
  /// After a backward: releases every unit.
  void after_backward();
  /// Gathers every unit until the next forward (gather_parameters()).
  void gather_all();

 private:
  void backward_enter(std::size_t unit);
  void release_all();
  /// The unit `step` places from `unit` in the previous forward's order, or -1.
  int neighbour(std::size_t unit, int step) const;

  std::shared_ptr<ShardedParameters> sharded_;
  ShardUnits units_;
  std::vector<std::size_t> bucket_of_unit_;
  std::vector<std::size_t> trained_count_;  // per unit
  mutable std::mutex mutex_;
  bool checked_ = false;
  std::vector<int> position_;             // per unit, in the previous forward's order (-1: did not run)
  std::vector<std::size_t> order_;        // of this forward
  std::vector<std::size_t> pending_;      // per unit, gradients not yet accumulated in this backward
  std::vector<std::uint8_t> entered_;     // per unit, in this forward
  std::vector<std::uint8_t> unseen_outputs_;  // per unit, in this forward: left with outputs in_unit cannot see
};

}  // namespace ddp::detail
