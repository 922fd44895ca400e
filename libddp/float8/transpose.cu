// The transpose of an FP8 matrix, byte for byte: for a kernel that writes
// an FP8 cast's row-major data but cannot write its transpose itself (the
// norm's backward walks one row at a time). Half the traffic of a cast that
// would read the bf16 values and write both.
//
// A block takes a tile of 32 rows x 128 columns through shared memory: each
// thread loads 16 bytes of one row, then turns a 4 x 4 block of bytes into
// 4 words, one per column, so that the 8 threads of a column write its 32
// bytes (one memory sector) together.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"
#include "cuda/float8_bytes.cuh"
#include "cuda/packs.cuh"
#include "float8/kernels.h"

namespace ddp::detail {
namespace {

constexpr int kTileRows = 32;
constexpr int kTileCols = 128;
constexpr int kThreads = 256;
// Words from one tile row to the next in shared memory: 33, so that the
// transposing reads (8 rows 4 apart x 4 words per warp) and the loads'
// stores (4 rows x 32 words) each fall in 32 different banks. Not a
// multiple of 4 words: the loads' 16 bytes are stored as 4 words.
constexpr int kStrideWords = kTileCols / 4 + 1;

__global__ void __launch_bounds__(kThreads)
    transpose_float8_kernel(const uint8_t* __restrict__ data, uint8_t* __restrict__ transposed, int64_t rows,
                            int64_t cols) {
  __shared__ uint32_t tile[kTileRows * kStrideWords];
  // Row tiles on x (up to 2^31 - 1 of them), column tiles on y.
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kTileCols;
  {
    // 32 rows x 8 chunks of 16 bytes: one chunk a thread.
    const int row = threadIdx.x / 8, chunk = threadIdx.x % 8;
    if (row0 + row < rows && col0 + 16 * chunk < cols) {
      const uint4 bytes = *reinterpret_cast<const uint4*>(data + (row0 + row) * cols + col0 + 16 * chunk);
      uint32_t* const words = &tile[row * kStrideWords + 4 * chunk];
      words[0] = bytes.x;
      words[1] = bytes.y;
      words[2] = bytes.z;
      words[3] = bytes.w;
    }
  }
  __syncthreads();
  // 8 blocks of 4 rows down x 32 blocks of 4 columns across: one a thread.
  const int block_row = threadIdx.x % 8, block_col = threadIdx.x / 8;
  const int64_t row = row0 + 4 * block_row;
  if (row >= rows || col0 + 4 * block_col >= cols) return;
  uint32_t in[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) in[r] = tile[(4 * block_row + r) * kStrideWords + block_col];
  uint32_t columns[4];
  transpose_4x4_bytes(in, columns);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    *reinterpret_cast<uint32_t*>(transposed + (col0 + 4 * block_col + c) * rows + row) = columns[c];
  }
}

}  // namespace

void transpose_float8(const at::Tensor& data, const at::Tensor& transposed) {
  TORCH_CHECK(
      data.is_cuda() && data.dim() == 2 && data.is_contiguous() && data.element_size() == 1 &&
          transposed.device() == data.device() && transposed.is_contiguous() &&
          transposed.scalar_type() == data.scalar_type() && transposed.size(0) == data.size(1) &&
          transposed.size(1) == data.size(0),
      "transpose_float8: contiguous one-byte data [rows, cols] and transposed [cols, rows] on one GPU expected, "
      "got ",
      data.sizes(), " and ", transposed.sizes());
  const int64_t rows = data.size(0), cols = data.size(1);
  TORCH_CHECK(rows % 4 == 0 && cols % 16 == 0 && aligned(data.data_ptr(), 16) && aligned(transposed.data_ptr(), 4),
              "transpose_float8: rows a multiple of 4 and columns of 16, data 16-byte and transposed 4-byte aligned, "
              "expected; got [",
              rows, ", ", cols, "]");
  if (rows == 0 || cols == 0) return;
  TORCH_CHECK((cols + kTileCols - 1) / kTileCols <= 65535, "transpose_float8: too many columns (", cols, ")");
  const c10::cuda::CUDAGuard device_guard(data.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(data.get_device());
  const dim3 grid(static_cast<unsigned>((rows + kTileRows - 1) / kTileRows),
                  static_cast<unsigned>((cols + kTileCols - 1) / kTileCols));
  transpose_float8_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint8_t*>(data.data_ptr()),
                                                         static_cast<uint8_t*>(transposed.data_ptr()), rows, cols);
  DDP_CUDA_CHECK_LAUNCH("transpose_float8_kernel");
}

}  // namespace ddp::detail
