#pragma once

// Deterministic randomness for the loaders. The standard library's
// distributions and std::shuffle differ between implementations, and the
// loaders' order must not: a resumed run, or a rank on another machine, has
// to draw the very same sequence. So the generator and every draw are spelled
// out here.

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace data {

/// SplitMix64 (Steele, Lea, Flood 2014): small, fast, and good enough to
/// shuffle data; also used to derive independent seeds.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  /// Uniform in [0, bound), without modulo bias; bound > 0.
  std::uint64_t below(std::uint64_t bound);

 private:
  std::uint64_t state_;
};

/// One seed from several values (seed, epoch, rank, step ...): different
/// inputs give unrelated streams, the same inputs always the same stream.
std::uint64_t mix_seed(std::initializer_list<std::uint64_t> values);

/// 0 .. n-1 in a random order that depends only on n and seed (Fisher-Yates).
std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed);

}  // namespace data
