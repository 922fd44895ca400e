#pragma once

// Removes a file or a folder with everything in it; a missing path is fine.
//
// Tests use this instead of std::filesystem::remove_all: the PyPI LibTorch 2.x
// exports its own std::filesystem::remove_all (built against another
// libstdc++), the dynamic linker binds test binaries to that copy, and it
// calls through a null pointer: the rank process and the harness died with
// SIGSEGV on the GPU machine when removing a non-empty folder.

#include <string>

namespace ddp::testing {

void remove_tree(const std::string& path);

}  // namespace ddp::testing
