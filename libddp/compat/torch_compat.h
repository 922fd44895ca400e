#pragma once

// Every difference between the LibTorch versions libddp builds against
// (Debian's 1.13 and PyPI's 2.x) lives here, so the rest of the code reads the
// same on both.

#include <torch/version.h>

#define DDP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
