#pragma once

// A process group as autograd's saved data holds it (an IValue capsule), for
// the backward of the functions that all-reduce across ranks.

#include <memory>
#include <utility>

#include <ATen/core/ivalue.h>

#include <ddp/process_group.h>

namespace ddp::detail {

struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(std::shared_ptr<ProcessGroup> process_group) : group(std::move(process_group)) {}
  std::shared_ptr<ProcessGroup> group;
};

inline c10::IValue capsule_of(const std::shared_ptr<ProcessGroup>& group) {
  return c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(group));
}

inline ProcessGroup& group_in(const c10::IValue& capsule) {
  return *static_cast<GroupCapsule*>(capsule.toCapsule().get())->group;
}

}  // namespace ddp::detail
