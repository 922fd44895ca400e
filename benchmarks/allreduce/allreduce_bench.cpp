// All-reduce bus bandwidth of libddp's NCCL communicator beside raw NCCL,
// measured in the same processes, on the same buffers, in the same run.
//
//   ddprun --nproc-per-node gpu build/benchmarks/allreduce/allreduce_bench \
//       --json results.json --markdown results.md
//
// Both sides run back-to-back in-place averages (ncclAvg) of one buffer, timed
// with CUDA events around a batch of iterations; trials alternate between the
// two so that clock and thermal drift hit both alike. busbw = algbw * 2(n-1)/n,
// as nccl-tests defines it.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <ddp/ddp.h>

#include "common/run_info.h"
#include "flags.h"

namespace {

#define CHECK_CUDA(call)                                                                              \
  do {                                                                                                \
    cudaError_t result_ = (call);                                                                     \
    if (result_ != cudaSuccess) throw std::runtime_error(fmt::format("{}: {}", #call, cudaGetErrorString(result_))); \
  } while (0)
#define CHECK_NCCL(call)                                                                              \
  do {                                                                                                \
    ncclResult_t result_ = (call);                                                                    \
    if (result_ != ncclSuccess) throw std::runtime_error(fmt::format("{}: {}", #call, ncclGetErrorString(result_))); \
  } while (0)

struct Args {
  std::int64_t min_bytes = 1 << 20;
  std::int64_t max_bytes = 1LL << 30;
  torch::Dtype dtype = torch::kBFloat16;
  int trials = 5;
  std::string json;
  std::string markdown;
};

Args parse_args(int argc, char** argv) {
  examples::Flags flags("allreduce_bench",
                        "All-reduce bus bandwidth of libddp's NCCL communicator beside raw NCCL, in one run.");
  flags.add("min-bytes", "1048576", "smallest message, in bytes")
      .add("max-bytes", "1073741824", "largest message, in bytes (sizes double in between)")
      .add("dtype", "bf16", "bf16 | fp32")
      .add("trials", "5", "timed trials per size; the best is reported")
      .add("json", "", "write the results to this file")
      .add("markdown", "", "write the table to this file");
  flags.parse(argc, argv);
  Args args;
  args.min_bytes = flags.integer("min-bytes");
  args.max_bytes = flags.integer("max-bytes");
  args.trials = static_cast<int>(flags.integer("trials"));
  args.json = flags.str("json");
  args.markdown = flags.str("markdown");
  const std::string dtype = flags.str("dtype");
  if (dtype != "bf16" && dtype != "fp32") flags.fail("--dtype takes bf16 or fp32, not '" + dtype + "'");
  args.dtype = dtype == "bf16" ? torch::kBFloat16 : torch::kFloat;
  if (args.min_bytes < 1 || args.max_bytes < args.min_bytes || args.trials < 1) {
    flags.fail("need 1 <= --min-bytes <= --max-bytes and --trials >= 1");
  }
  return args;
}

/// Times `iterations` calls of `launch` on `stream` with CUDA events; milliseconds per call.
template <typename Launch>
double time_per_call(cudaStream_t stream, int iterations, Launch&& launch) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start, stream));
  for (int i = 0; i < iterations; ++i) launch();
  CHECK_CUDA(cudaEventRecord(stop, stream));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return ms / iterations;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Row {
  std::int64_t bytes;
  double raw_ms, ddp_ms, raw_busbw, ddp_busbw;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse_args(argc, argv);
    auto pg = ddp::init();
    auto& comm = pg->communicator();
    if (pg->backend() != ddp::Backend::kNccl) throw std::runtime_error("this benchmark needs the NCCL backend (GPUs)");
    const int world = pg->world_size();
    const auto device = pg->device();
    const auto options = torch::TensorOptions().device(device).dtype(args.dtype);

    // Raw NCCL communicator over the same ranks; its id travels through libddp.
    ncclUniqueId id;
    if (pg->rank() == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    torch::Tensor id_bytes = torch::zeros({static_cast<long>(sizeof(id))}, torch::TensorOptions().dtype(torch::kUInt8));
    if (pg->rank() == 0) std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
    torch::Tensor id_device = id_bytes.to(device);
    comm.broadcast(id_device, 0)->wait();
    id_bytes = id_device.cpu();
    std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));
    ncclComm_t raw;
    CHECK_NCCL(ncclCommInitRank(&raw, world, id, pg->rank()));

    auto stream = c10::cuda::getStreamFromPool(false, device.index());
    c10::cuda::CUDAStreamGuard guard(stream);
    const ncclDataType_t nccl_type = args.dtype == torch::kBFloat16 ? ncclBfloat16 : ncclFloat32;
    const double bus_factor = 2.0 * (world - 1) / world;
    const std::int64_t element = torch::elementSize(args.dtype);

    std::vector<Row> rows;
    for (std::int64_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= 2) {
      const std::int64_t count = bytes / element;
      torch::Tensor buffer = torch::randn({count}, options);

      // Correctness first: the average of rank-dependent values.
      torch::Tensor check = torch::full({count}, static_cast<double>(pg->rank()), options);
      comm.all_reduce(check, ddp::ReduceOp::kAvg)->wait();
      TORCH_CHECK(check.eq((world - 1) / 2.0).all().item<bool>(), "libddp all_reduce gave a wrong average");

      // About 50 ms per trial at 200 GB/s, within [5, 200] iterations.
      const int iterations = static_cast<int>(std::clamp<double>(0.05 / (bytes / 200e9 + 30e-6), 5, 200));
      auto raw_call = [&] {
        CHECK_NCCL(ncclAllReduce(buffer.data_ptr(), buffer.data_ptr(), count, nccl_type, ncclAvg, raw, stream.stream()));
      };
      auto ddp_call = [&] { comm.all_reduce(buffer, ddp::ReduceOp::kAvg)->wait_stream(); };
      time_per_call(stream.stream(), 3, raw_call);  // warm-up: connections, buffers, clocks
      time_per_call(stream.stream(), 3, ddp_call);
      std::vector<double> raw_ms, ddp_ms;
      for (int trial = 0; trial < args.trials; ++trial) {
        raw_ms.push_back(time_per_call(stream.stream(), iterations, raw_call));
        ddp_ms.push_back(time_per_call(stream.stream(), iterations, ddp_call));
      }
      Row row{bytes, median(raw_ms), median(ddp_ms), 0, 0};
      row.raw_busbw = bytes / (row.raw_ms * 1e-3) / 1e9 * bus_factor;
      row.ddp_busbw = bytes / (row.ddp_ms * 1e-3) / 1e9 * bus_factor;
      rows.push_back(row);
    }
    // Host cost of issuing one collective (smallest size, no waiting): what
    // DDP pays per bucket on the CPU, beside raw NCCL's own call.
    const std::int64_t small_count = args.min_bytes / element;
    torch::Tensor small = torch::randn({small_count}, options);
    auto host_us_per_call = [&](auto&& launch) {
      constexpr int kCalls = 200;
      CHECK_CUDA(cudaStreamSynchronize(stream.stream()));
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kCalls; ++i) launch();
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
      CHECK_CUDA(cudaStreamSynchronize(stream.stream()));
      return us / kCalls;
    };
    std::vector<double> raw_host, ddp_host;
    for (int trial = 0; trial < args.trials; ++trial) {
      raw_host.push_back(host_us_per_call([&] {
        CHECK_NCCL(ncclAllReduce(small.data_ptr(), small.data_ptr(), small_count, nccl_type, ncclAvg, raw, stream.stream()));
      }));
      ddp_host.push_back(host_us_per_call([&] { comm.all_reduce(small, ddp::ReduceOp::kAvg)->wait_stream(); }));
    }
    comm.barrier();
    CHECK_NCCL(ncclCommDestroy(raw));

    if (pg->rank() == 0) {
      const bench::RunInfo info = bench::run_info(device.index());
      int nccl_version = 0;
      ncclGetVersion(&nccl_version);
      const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
      const std::string dtype_name = args.dtype == torch::kBFloat16 ? "bf16" : "fp32";
      const std::string header = fmt::format(
          "device: {} x {} | date: {} | commit: {} | NCCL {} | LibTorch {} | dtype {} | NCCL_NVLS_ENABLE={}",
          world, info.gpu, info.date, info.commit, nccl_version, TORCH_VERSION, dtype_name, nvls ? nvls : "<unset>");
      std::string table = "| size | raw NCCL time | raw busbw | libddp time | libddp busbw | libddp / raw |\n"
                          "|---|---|---|---|---|---|\n";
      std::string json_rows;
      for (const Row& row : rows) {
        table += fmt::format("| {} MiB | {:.3f} ms | {:.1f} GB/s | {:.3f} ms | {:.1f} GB/s | {:.1f}% |\n",
                             row.bytes >> 20, row.raw_ms, row.raw_busbw, row.ddp_ms, row.ddp_busbw,
                             100.0 * row.ddp_busbw / row.raw_busbw);
        json_rows += fmt::format("{}    {{\"bytes\": {}, \"raw_ms\": {:.5f}, \"raw_busbw_gbps\": {:.2f}, "
                                 "\"ddp_ms\": {:.5f}, \"ddp_busbw_gbps\": {:.2f}}}",
                                 json_rows.empty() ? "" : ",\n", row.bytes, row.raw_ms, row.raw_busbw, row.ddp_ms,
                                 row.ddp_busbw);
      }
      table += fmt::format("\nHost time to issue one {} MiB all-reduce (median of {} trials of 200 calls): raw NCCL "
                           "{:.1f} us, libddp (all_reduce + wait_stream) {:.1f} us.\n",
                           args.min_bytes >> 20, args.trials, median(raw_host), median(ddp_host));
      std::printf("%s\n\n%s", header.c_str(), table.c_str());
      if (!args.markdown.empty()) std::ofstream(args.markdown) << "# All-reduce bus bandwidth\n\n" << header << "\n\n" << table;
      if (!args.json.empty()) {
        std::ofstream(args.json) << fmt::format(
            "{{\n  \"benchmark\": \"allreduce\",\n  \"device\": \"{}\",\n  \"gpus\": {},\n  \"date\": \"{}\",\n"
            "  \"commit\": \"{}\",\n  \"nccl_version\": {},\n  \"torch_version\": \"{}\",\n  \"dtype\": \"{}\",\n"
            "  \"op\": \"avg\",\n  \"host_us_per_call\": {{\"bytes\": {}, \"raw\": {:.2f}, \"ddp\": {:.2f}}},\n"
            "  \"rows\": [\n{}\n  ]\n}}\n",
            info.gpu, world, info.date, info.commit, nccl_version, TORCH_VERSION, dtype_name, args.min_bytes, median(raw_host), median(ddp_host), json_rows);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: error: %s\n", e.what());
    return 1;
  }
}
