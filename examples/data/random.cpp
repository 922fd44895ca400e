#include "random.h"

#include <numeric>
#include <utility>

namespace data {

std::uint64_t SplitMix64::next() {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint64_t SplitMix64::below(std::uint64_t bound) {
  // Reject the top partial copy of [0, bound) so every value is equally likely.
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  std::uint64_t value = next();
  while (value >= limit) value = next();
  return value % bound;
}

std::uint64_t mix_seed(std::initializer_list<std::uint64_t> values) {
  std::uint64_t seed = 0x2545F4914F6CDD1Dull;
  for (std::uint64_t value : values) seed = SplitMix64(seed ^ value).next();
  return seed;
}

std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  SplitMix64 generator(seed);
  for (std::int64_t i = n - 1; i > 0; --i) {
    std::swap(order[i], order[generator.below(static_cast<std::uint64_t>(i) + 1)]);
  }
  return order;
}

}  // namespace data
