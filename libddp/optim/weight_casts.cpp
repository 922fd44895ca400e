#include "optim/weight_casts.h"

#include <mutex>
#include <unordered_map>

#include <c10/core/TensorImpl.h>
#include <c10/core/UndefinedTensorImpl.h>
#include <c10/util/intrusive_ptr.h>

namespace ddp::detail {
namespace {

struct Entry {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>
      weight;  // to tell the weight from a later tensor at its address
  std::weak_ptr<WeightCastTarget> target;
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, Entry> entries;
  std::size_t swept_at = 0;  // the size at the last sweep of dead entries
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: layers may outlive static destruction
  return *instance;
}

bool alive(const Entry& entry) { return !entry.weight.expired() && !entry.target.expired(); }

}  // namespace

void set_weight_cast_target(const at::Tensor& weight, const std::shared_ptr<WeightCastTarget>& target) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  c10::TensorImpl* impl = weight.unsafeGetTensorImpl();
  r.entries.insert_or_assign(
      impl,
      Entry{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(weight.getIntrusivePtr()), target});
  // Models made and dropped (tests, evaluation copies) leave dead entries;
  // sweeping whenever the map doubles keeps it near its live size.
  if (r.entries.size() >= 2 * r.swept_at + 64) {
    for (auto it = r.entries.begin(); it != r.entries.end();)
      it = alive(it->second) ? std::next(it) : r.entries.erase(it);
    r.swept_at = r.entries.size();
  }
}

std::shared_ptr<WeightCastTarget> weight_cast_target(const at::Tensor& weight) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const auto found = r.entries.find(weight.unsafeGetTensorImpl());
  if (found == r.entries.end()) return nullptr;
  const auto registered = found->second.weight.lock();
  if (registered.get() != weight.unsafeGetTensorImpl()) return nullptr;  // another tensor, at a reused address
  return found->second.target.lock();
}

}  // namespace ddp::detail
