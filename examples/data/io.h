#pragma once

// File access shared by the data formats: read-only memory maps, and files
// written under a temporary name and renamed into place, so a reader never
// sees half a file and a crashed writer leaves no file that looks complete.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace data {

/// Every problem with data files and directories; the message names the file.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Throws DataError "<call> <path>: <strerror(errno)>".
[[noreturn]] void throw_errno(const std::string& call, const std::string& path);

/// A whole file mapped read-only. Pages are loaded on first touch, so opening
/// a large file is cheap and only what is read costs memory.
class MappedFile {
 public:
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&&) = delete;

  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Writes `path` through "<path>.tmp": commit() flushes it to disk and renames
/// it over `path`; destruction without commit() removes the temporary file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* bytes, std::size_t count);
  void commit();

 private:
  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
};

}  // namespace data
