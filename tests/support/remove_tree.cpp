#include "support/remove_tree.h"

#include <ftw.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace ddp::testing {

void remove_tree(const std::string& path) {
  // Depth first, so a folder is empty when its turn comes; links are removed, not followed.
  const auto remove_one = [](const char* entry, const struct stat*, int, struct FTW*) { return std::remove(entry); };
  if (::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT) {
    throw std::runtime_error("cannot remove " + path + ": " + std::strerror(errno));
  }
}

}  // namespace ddp::testing
