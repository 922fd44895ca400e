#pragma once

/// Marks what libddp exports. The library is built with hidden visibility
/// (as LibTorch is, with TORCH_API): only what its public headers declare
/// with DDP_API can be linked against, and everything under libddp/ stays
/// private to the library, free to change without breaking programs that
/// link it. The same attribute serves the library and its users.
#define DDP_API __attribute__((visibility("default")))
