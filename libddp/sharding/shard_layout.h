#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp::detail {

/// How one bucket's parameters lie in its flat buffer and which part of that
/// buffer each rank owns, as ZeRO and FSDP's flat parameters: the parameters
/// one after another in bucket order, then zero padding up to world_size
/// equal, aligned shards. Rank r owns elements [r * shard_numel, (r + 1) * shard_numel).
struct ShardLayout {
  /// Part of one parameter that lies in this rank's shard.
  struct Fragment {
    std::size_t slot;     ///< The parameter's position in the bucket.
    std::int64_t begin;   ///< First element, as an offset into the flat buffer.
    std::int64_t length;  ///< Elements; never 0.
  };

  std::vector<std::int64_t> offsets;  ///< Per parameter, its first element in the flat buffer.
  std::vector<std::int64_t> numels;   ///< Per parameter.
  std::int64_t numel = 0;             ///< Of the parameters, padding excluded.
  std::int64_t padded_numel = 0;      ///< world_size x shard_numel.
  std::int64_t shard_numel = 0;
  int world_size = 1;

  /// The parameters' parts in `rank`'s shard, in bucket order (padding has none).
  std::vector<Fragment> fragments(int rank) const;
};

/// Elements a shard is rounded up to: 64 x 4 bytes keeps every rank's shard
/// 256-byte aligned for fp32 (NCCL and vectorised kernels read whole lines).
constexpr std::int64_t kShardAlignment = 64;

/// Lays out parameters of `numels` elements (in bucket order) over `world_size` ranks.
ShardLayout layout_shards(const std::vector<std::int64_t>& numels, int world_size);

}  // namespace ddp::detail
