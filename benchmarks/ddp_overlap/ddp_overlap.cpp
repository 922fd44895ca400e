// How much of DDP's gradient all-reduce hides behind backward, for ResNet-50.
//
//   ddprun --nproc-per-node gpu build/benchmarks/ddp_overlap/ddp_overlap --json out.json --markdown out.md
//
// Measured in one run, each a median over timed iterations with CUDA events
// on the training stream:
//   local backward  backward of the bare module, no communication;
//   DDP backward    backward of the DDP-wrapped module, until the training
//                   stream may use the averaged gradients;
//   communication   the same buckets all-reduced one after another alone.
// exposed = DDP backward - local backward; hidden = 1 - exposed / communication.
// That counts as communication everything DDP adds to backward (the
// reducer's host work, NCCL kernels slowing the compute kernels they share
// the GPU with). The DDP timeline (record_timeline) separates them: from
// device events it gives the time the reductions ran and the part of it left
// after the last backward kernel; timeline hidden = 1 - that / the former.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <ddp/ddp.h>

#include "common/run_info.h"
#include "flags.h"
#include "resnet.h"

namespace {

struct Args {
  int batch = 128;
  int iterations = 20;
  double bucket_cap_mb = 25;
  std::string timeline;  // Chrome-trace path prefix
  bool record_timeline = true;  // false: measure DDP without the timeline's events
  bool communicate = true;  // false: a comm hook that does nothing, to isolate the reducer's own cost
  std::string json, markdown;
};

Args parse_args(int argc, char** argv) {
  examples::Flags flags("ddp_overlap", "How much of DDP's gradient all-reduce hides behind backward, for ResNet-50.");
  flags.add("batch", "128", "images per GPU")
      .add("iterations", "20", "timed iterations (medians are reported)")
      .add("bucket-cap-mb", "25", "DDP's bucket size")
      .add("timeline", "", "write Chrome traces of DDP's timeline with this path prefix")
      .add_switch("no-timeline", "measure DDP without the timeline's events")
      .add_switch("no-communication", "a comm hook that does nothing, to isolate the reducer's own cost")
      .add("json", "", "write the results to this file")
      .add("markdown", "", "write the table to this file");
  flags.parse(argc, argv);
  Args args;
  args.batch = static_cast<int>(flags.integer("batch"));
  args.iterations = static_cast<int>(flags.integer("iterations"));
  args.bucket_cap_mb = flags.real("bucket-cap-mb");
  args.timeline = flags.str("timeline");
  args.record_timeline = !flags.on("no-timeline");
  args.communicate = !flags.on("no-communication");
  args.json = flags.str("json");
  args.markdown = flags.str("markdown");
  if (args.batch < 1 || args.iterations < 1 || args.bucket_cap_mb <= 0) {
    flags.fail("--batch and --iterations must be at least 1, --bucket-cap-mb positive");
  }
  return args;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

/// Milliseconds between two events recorded around `body` on the current stream.
template <typename Body>
double device_ms(Body&& body) {
  auto stream = c10::cuda::getCurrentCUDAStream();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream.stream());
  body();
  cudaEventRecord(stop, stream.stream());
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse_args(argc, argv);
    auto pg = ddp::init();
    if (pg->backend() != ddp::Backend::kNccl) throw std::runtime_error("this benchmark needs GPUs (NCCL)");
    const auto device = pg->device();
    at::globalContext().setAllowTF32CuBLAS(true);
    at::globalContext().setAllowTF32CuDNN(true);
    at::globalContext().setBenchmarkCuDNN(true);

    torch::manual_seed(0);
    auto model = resnet::resnet50();
    model->to(device);
    for (auto& p : model->parameters()) {
      if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
    }
    torch::Tensor input = torch::randn({args.batch, 3, 224, 224}, torch::TensorOptions().device(device))
                              .contiguous(at::MemoryFormat::ChannelsLast);
    torch::Tensor target = torch::randint(0, 1000, {args.batch}, torch::TensorOptions().device(device).dtype(torch::kLong));

    auto backward_ms = [&](auto&& forward) {
      std::vector<double> times;
      for (int i = 0; i < args.iterations + 3; ++i) {
        model->zero_grad();
        torch::Tensor loss = torch::cross_entropy_loss(forward(), target);
        const double ms = device_ms([&] { loss.backward(); });
        if (i >= 3) times.push_back(ms);  // the first iterations pick cuDNN algorithms and build buckets
      }
      return median(times);
    };
    const double local = backward_ms([&] { return model->forward(input); });
    auto options = ddp::DistributedDataParallelOptions().bucket_cap_mb(args.bucket_cap_mb).record_timeline(args.record_timeline);
    if (!args.timeline.empty()) options.timeline_path(fmt::format("{}.rank{}.json", args.timeline, pg->rank()));
    if (!args.communicate) {
      options.comm_hook([](ddp::Communicator&, const ddp::GradBucket&) { return std::function<void()>([] {}); });
    }
    ddp::DistributedDataParallel<resnet::ResNet> ddp_model(model, pg, options);
    const double with_ddp = backward_ms([&] { return ddp_model(input); });
    std::vector<double> timeline_backward, timeline_comm, timeline_exposed;
    const auto timings = ddp_model.timings();
    for (std::size_t i = 3; i < timings.size(); ++i) {  // as above, without the first iterations
      timeline_backward.push_back(timings[i].backward_ms);
      timeline_comm.push_back(timings[i].communication_ms);
      timeline_exposed.push_back(timings[i].exposed_communication_ms);
    }
    const double tl_backward = timings.empty() ? 0 : median(timeline_backward);
    const double tl_comm = timings.empty() ? 0 : median(timeline_comm);
    const double tl_exposed = timings.empty() ? 0 : median(timeline_exposed);
    const double tl_hidden = tl_comm > 0 ? 1.0 - tl_exposed / tl_comm : 1.0;

    const std::vector<std::size_t> buckets = ddp_model.bucket_bytes();
    std::vector<torch::Tensor> flat;
    for (std::size_t bytes : buckets) flat.push_back(torch::randn({static_cast<long>(bytes / 4)}, torch::TensorOptions().device(device)));
    std::vector<double> comm_times;
    for (int i = 0; i < args.iterations + 3; ++i) {
      const double ms = device_ms([&] {
        for (auto& buffer : flat) pg->communicator().all_reduce(buffer, ddp::ReduceOp::kAvg)->wait_stream();
      });
      if (i >= 3) comm_times.push_back(ms);
    }
    const double communication = median(comm_times);
    const double exposed = std::max(0.0, with_ddp - local);
    const double hidden = communication > 0 ? std::max(0.0, 1.0 - exposed / communication) : 1.0;

    if (pg->rank() == 0) {
      std::size_t total = 0;
      for (std::size_t b : buckets) total += b;
      const bench::RunInfo info = bench::run_info(device.index());
      const std::string header = fmt::format(
          "device: {} x {} | date: {} | commit: {} | LibTorch {} | ResNet-50, batch {}/GPU, fp32 with TF32, "
          "channels_last | {} buckets (cap {} MiB), {:.1f} MiB of gradients{}",
          pg->world_size(), info.gpu, info.date, info.commit, TORCH_VERSION, args.batch, buckets.size(),
          args.bucket_cap_mb, total / 1048576.0, args.communicate ? "" : " | NO COMMUNICATION (reducer cost only)");
      std::string table = fmt::format(
          "| local backward | DDP backward | exposed communication | all-reduce of the buckets alone | hidden |\n"
          "|---|---|---|---|---|\n"
          "| {:.2f} ms | {:.2f} ms | {:.2f} ms | {:.2f} ms | {:.1f}% |\n",
          local, with_ddp, exposed, communication, 100 * hidden);
      table += args.record_timeline
                   ? fmt::format("\nTimeline (device events, same iterations): backward {:.2f} ms; the reductions "
                                 "ran {:.2f} ms, of which {:.3f} ms after the last backward kernel: **{:.1f}% "
                                 "hidden**.\n",
                                 tl_backward, tl_comm, tl_exposed, 100 * tl_hidden)
                   : "\n(timeline not recorded)\n";
      std::printf("%s\n\n%s", header.c_str(), table.c_str());
      if (!args.markdown.empty()) std::ofstream(args.markdown) << "# DDP overlap\n\n" << header << "\n\n" << table;
      if (!args.json.empty()) {
        std::ofstream(args.json) << fmt::format(
            "{{\n  \"benchmark\": \"ddp_overlap\",\n  \"model\": \"resnet50\",\n  \"device\": \"{}\",\n  \"gpus\": {},\n"
            "  \"date\": \"{}\",\n  \"commit\": \"{}\",\n  \"batch_per_gpu\": {},\n  \"buckets\": {},\n"
            "  \"gradient_mib\": {:.2f},\n  \"local_backward_ms\": {:.3f},\n  \"ddp_backward_ms\": {:.3f},\n"
            "  \"exposed_ms\": {:.3f},\n  \"communication_ms\": {:.3f},\n  \"hidden_fraction\": {:.4f},\n"
            "  \"bucket_cap_mb\": {},\n  \"timeline_backward_ms\": {:.3f},\n  \"timeline_communication_ms\": {:.3f},\n"
            "  \"timeline_exposed_ms\": {:.4f},\n  \"timeline_hidden_fraction\": {:.4f}\n}}\n",
            info.gpu, pg->world_size(), info.date, info.commit, args.batch, buckets.size(),
            total / 1048576.0, local, with_ddp, exposed, communication, hidden, args.bucket_cap_mb, tl_backward,
            tl_comm, tl_exposed, tl_hidden);
      }
    }
    pg->communicator().barrier();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_overlap: error: %s\n", e.what());
    return 1;
  }
}
