#pragma once

#include <functional>
#include <string>

#include <ddp/export.h>

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace ddp {

class ProcessGroup;

namespace checkpoint {

/// Writes `archive` to `path` so that `path` always holds either the previous
/// complete checkpoint or the new one, never a torn file: the bytes go to a
/// temporary file in the same directory, sealed with a checksum of its bytes
/// (XXH64, in a 32-byte trailer LibTorch's reader ignores), flushed to disk
/// (fsync) and renamed over `path`; then the directory entry is flushed too.
/// Temporary files an interrupted save of `path` left are removed first.
/// Throws Error naming the path and the failing call.
DDP_API void save(torch::serialize::OutputArchive& archive, const std::string& path);

/// Loads a checkpoint written by save(), first checking its seal. Throws
/// UsageError naming the path when it is missing, unreadable, not a
/// checkpoint, truncated, or damaged (its bytes no longer match the
/// checksum). A file without a seal (Module::save's, or an older libddp's)
/// is read unchecked.
DDP_API void load(torch::serialize::InputArchive& archive, const std::string& path);

/// Whether `directory` holds a committed sharded checkpoint
/// (DistributedDataParallel::save_sharded_checkpoint): its manifest exists.
/// A save that never finished leaves none, and resuming should start afresh.
DDP_API bool is_sharded_checkpoint(const std::string& directory);

/// The usual pattern of data-parallel training: rank 0 fills an archive with
/// `write` and saves it atomically while the others wait, so that when this
/// returns on any rank the checkpoint is complete on disk. An error on rank 0
/// reaches every rank (the others fail at the barrier instead of going on
/// without a checkpoint).
DDP_API void save_on_rank0(ProcessGroup& process_group, const std::string& path,
                           const std::function<void(torch::serialize::OutputArchive&)>& write);

}  // namespace checkpoint
}  // namespace ddp
