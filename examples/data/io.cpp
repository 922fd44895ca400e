#include "io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace data {

void throw_errno(const std::string& call, const std::string& path) {
  throw DataError(call + " " + path + ": " + std::strerror(errno));
}

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("open", path_);
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    throw_errno("fstat", path_);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    throw DataError(path_ + ": not a regular file");
  }
  size_ = static_cast<std::size_t>(info.st_size);
  // mmap refuses a length of 0; an empty file simply has no bytes.
  if (size_ > 0) {
    void* address = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (address == MAP_FAILED) {
      const int saved = errno;
      ::close(fd);
      errno = saved;
      throw_errno("mmap", path_);
    }
    data_ = static_cast<const std::uint8_t*>(address);
  }
  // The mapping keeps the file alive; the descriptor is no longer needed.
  if (::close(fd) != 0) {
    if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
    throw_errno("close", path_);
  }
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile::~MappedFile() {
  // munmap only fails for an invalid range, which this class never passes.
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)), temp_path_(path_ + ".tmp") {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("open", temp_path_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;
  // Abandoned: a failed write or an exception in the caller. Nothing to report
  // from a destructor; the temporary file is removed so it cannot be mistaken.
  ::close(fd_);
  ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::write(const void* bytes, std::size_t count) {
  const auto* cursor = static_cast<const std::uint8_t*>(bytes);
  while (count > 0) {
    const ssize_t written = ::write(fd_, cursor, count);
    if (written < 0) {
      if (errno == EINTR) continue;
      throw_errno("write", temp_path_);
    }
    cursor += written;
    count -= static_cast<std::size_t>(written);
  }
}

void AtomicFileWriter::commit() {
  if (::fsync(fd_) != 0) throw_errno("fsync", temp_path_);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    ::unlink(temp_path_.c_str());
    throw_errno("close", temp_path_);
  }
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int saved = errno;
    ::unlink(temp_path_.c_str());
    errno = saved;
    throw_errno("rename to " + path_, temp_path_);
  }
}

}  // namespace data
