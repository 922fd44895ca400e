#include "sharding/shard_layout.h"

#include <algorithm>

namespace ddp::detail {

ShardLayout layout_shards(const std::vector<std::int64_t>& numels, int world_size) {
  ShardLayout layout;
  layout.world_size = world_size;
  layout.numels = numels;
  for (std::int64_t numel : numels) {
    layout.offsets.push_back(layout.numel);
    layout.numel += numel;
  }
  const std::int64_t per_rank = (layout.numel + world_size - 1) / world_size;
  layout.shard_numel = (per_rank + kShardAlignment - 1) / kShardAlignment * kShardAlignment;
  layout.padded_numel = layout.shard_numel * world_size;
  return layout;
}

std::vector<ShardLayout::Fragment> ShardLayout::fragments(int rank) const {
  const std::int64_t shard_begin = rank * shard_numel;
  const std::int64_t shard_end = shard_begin + shard_numel;
  std::vector<Fragment> result;
  for (std::size_t slot = 0; slot < offsets.size(); ++slot) {
    const std::int64_t begin = std::max(offsets[slot], shard_begin);
    const std::int64_t end = std::min(offsets[slot] + numels[slot], shard_end);
    if (begin < end) result.push_back({slot, begin, end - begin});
  }
  return result;
}

}  // namespace ddp::detail
