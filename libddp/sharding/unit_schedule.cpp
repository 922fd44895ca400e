#include "sharding/unit_schedule.h"

#include <unordered_map>
#include <utility>

#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ddp/distributed_data_parallel.h>
#include <ddp/errors.h>

#include "sharding/sharded_parameters.h"

namespace ddp::detail {
namespace {

struct Registration {
  std::weak_ptr<UnitSchedule> schedule;
  std::size_t unit;
};

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::unordered_map<const void*, Registration>& registry() {
  static std::unordered_map<const void*, Registration> units;
  return units;
}

}  // namespace

UnitSchedule::UnitSchedule(std::shared_ptr<ShardedParameters> sharded, ShardUnits units,
                           std::vector<std::size_t> bucket_of_unit)
    : sharded_(std::move(sharded)),
      units_(std::move(units)),
      bucket_of_unit_(std::move(bucket_of_unit)),
      trained_count_(units_.names.size(), 0),
      position_(units_.names.size(), -1),
      pending_(units_.names.size(), 0),
      entered_(units_.names.size(), 0),
      unseen_outputs_(units_.names.size(), 0) {
  for (int unit : units_.unit_of_parameter) {
    if (unit >= 0) ++trained_count_[unit];
  }
}

UnitSchedule::~UnitSchedule() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const auto* module : units_.modules) {
    auto it = registry().find(module);
    if (it != registry().end() && it->second.schedule.expired()) registry().erase(it);
  }
}

void UnitSchedule::register_units() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (std::size_t unit = 0; unit < units_.modules.size(); ++unit) {
    registry()[units_.modules[unit]] = Registration{weak_from_this(), unit};
  }
}

std::shared_ptr<UnitSchedule> UnitSchedule::find(const void* module, std::size_t& unit) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(module);
  if (it == registry().end()) return nullptr;
  unit = it->second.unit;
  return it->second.schedule.lock();
}

int UnitSchedule::neighbour(std::size_t unit, int step) const {
  if (position_[unit] < 0) return -1;
  const int wanted = position_[unit] + step;
  for (std::size_t other = 0; other < position_.size(); ++other) {
    if (position_[other] == wanted) return static_cast<int>(other);
  }
  return -1;
}

void UnitSchedule::release_all() {
  for (std::size_t bucket : bucket_of_unit_) sharded_->release(bucket);
}

void UnitSchedule::before_forward() {
  std::lock_guard<std::mutex> lock(mutex_);
  order_.clear();
  std::fill(entered_.begin(), entered_.end(), 0);
  std::fill(unseen_outputs_.begin(), unseen_outputs_.end(), 0);
  pending_ = trained_count_;
  if (checked_) {
    release_all();
    return;
  }
  // Until a forward is checked every unit stays gathered (as constructed).
  for (std::size_t bucket : bucket_of_unit_) sharded_->start_gather(bucket);
  for (std::size_t bucket : bucket_of_unit_) sharded_->finish_gather(bucket);
}

bool UnitSchedule::checked() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return checked_;
}

void UnitSchedule::after_forward(const std::vector<std::uint8_t>* used) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::fill(position_.begin(), position_.end(), -1);
  for (std::size_t i = 0; i < order_.size(); ++i) position_[order_[i]] = static_cast<int>(i);
  if (checked_) {
    // Keep only what backward needs first (leave() decided); drop prefetches
    // and finish deferred gathers of units that did not run (the optimizer
    // steps into resident buffers).
    for (std::size_t unit = 0; unit < units_.names.size(); ++unit) {
      if (entered_[unit]) continue;
      sharded_->settle(bucket_of_unit_[unit]);
      sharded_->release(bucket_of_unit_[unit]);
    }
    return;
  }
  if (used == nullptr) return;  // no graph to check (no grad): everything stays gathered
  std::vector<std::string> outside;
  for (std::size_t unit = 0; unit < units_.names.size(); ++unit) {
    if (entered_[unit]) continue;
    bool unit_used = false;
    for (std::size_t i = 0; i < used->size(); ++i) {
      unit_used = unit_used || ((*used)[i] != 0 && units_.unit_of_parameter[i] == static_cast<int>(unit));
    }
    if (unit_used) outside.push_back(units_.names[unit]);
  }
  if (!outside.empty()) {
    throw UsageError(fmt::format(
        "libddp: shard units {} ran outside ddp::in_unit, so their parameters could not be gathered for them; "
        "call each unit through ddp::in_unit(*unit, [&] {{ return unit->forward(...); }}) in the model's forward, "
        "or leave it out of shard_units",
        fmt::join(outside, ", ")));
  }
  checked_ = true;
  // From here on units are gathered as they run: backward gathers each again,
  // but for those whose outputs leave no hook to do it.
  for (std::size_t unit = 0; unit < units_.names.size(); ++unit) {
    if (!(entered_[unit] && unseen_outputs_[unit])) sharded_->release(bucket_of_unit_[unit]);
  }
  sharded_->restart_peak();  // what training holds, not the check's one-off gather
}

void UnitSchedule::enter(std::size_t unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  entered_[unit] = 1;
  order_.push_back(unit);
  sharded_->finish_gather(bucket_of_unit_[unit]);
  if (!checked_) return;
  const int next = neighbour(unit, +1);
  if (next >= 0) sharded_->start_gather(bucket_of_unit_[next]);
}

void UnitSchedule::leave(std::size_t unit, const std::vector<at::Tensor>& outputs) {
  std::weak_ptr<UnitSchedule> weak = weak_from_this();
  bool backward_comes = false;
  if (at::GradMode::is_enabled()) {
    for (const at::Tensor& output : outputs) {
      // A leaf (a parameter returned as is) has no backward of the unit to precede.
      if (!output.defined() || !output.requires_grad() || output.is_leaf()) continue;
      backward_comes = true;
      output.register_hook([weak, unit](const auto&) {
        if (auto self = weak.lock()) self->backward_enter(unit);
      });
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // Outputs it cannot see (a type in_unit does not know) leave no hook to
  // gather the unit again: keep it until the backward has run.
  unseen_outputs_[unit] = outputs.empty() && at::GradMode::is_enabled();
  if (!checked_) return;  // the first forward keeps every unit until after_forward()
  if (unseen_outputs_[unit]) return;
  // The unit whose forward came last is the first backward needs.
  const bool last = position_[unit] >= 0 && neighbour(unit, +1) < 0;
  if (backward_comes && last) return;
  sharded_->release(bucket_of_unit_[unit]);
}

void UnitSchedule::backward_enter(std::size_t unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  sharded_->finish_gather(bucket_of_unit_[unit]);
  const int previous = neighbour(unit, -1);
  if (previous >= 0) sharded_->start_gather(bucket_of_unit_[previous]);
}

void UnitSchedule::gradient_ready(std::size_t index) {
  const int unit = units_.unit_of_parameter[index];
  if (unit < 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // Every use of the unit's parameters in backward is done once each has
  // its gradient: the kernels that read them are queued on this stream, so
  // the memory is reused only after them.
  if (pending_[unit] > 0 && --pending_[unit] == 0) sharded_->release(bucket_of_unit_[unit]);
}

void UnitSchedule::after_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_all();
}

void UnitSchedule::gather_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_all();  // the optimizer may have stepped the shards since they were gathered
  for (std::size_t bucket : bucket_of_unit_) sharded_->start_gather(bucket);
  for (std::size_t bucket : bucket_of_unit_) sharded_->finish_gather(bucket);
}

UnitScope::UnitScope(const torch::nn::Module& unit) {
  schedule_ = UnitSchedule::find(&unit, unit_);
  if (schedule_) schedule_->enter(unit_);
}

void UnitScope::leave(const std::vector<at::Tensor>& outputs) {
  if (schedule_) schedule_->leave(unit_, outputs);
}

}  // namespace ddp::detail
