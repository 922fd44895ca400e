#pragma once

// Reading what a checkpoint must hold. InputArchive::read throws a c10::Error
// with a stack trace for a missing key; a file that lacks an entry libddp
// always writes is corrupt or someone else's, and its reader says so in one line.

#include <string>

#include <fmt/format.h>
#include <torch/serialize/input-archive.h>

#include <ddp/errors.h>

namespace ddp::detail {

/// Reads entry `key` of `archive` into `value` (an IValue, a tensor or a
/// nested archive). UsageError if it is missing, naming `source` (what the
/// archive is, e.g. "sharded checkpoint file '/ckpt/manifest.pt'").
template <typename Value>
void read_entry(torch::serialize::InputArchive& archive, const std::string& key, Value& value,
                const std::string& source) {
  if (!archive.try_read(key, value)) {
    throw UsageError(fmt::format("{} has no '{}': it is corrupt or was not written by libddp", source, key));
  }
}

}  // namespace ddp::detail
