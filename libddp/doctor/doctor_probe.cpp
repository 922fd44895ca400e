// ddp_doctor_probe: the worker of ddprun --doctor, one per GPU (or 2 on the
// CPU). It checks what only a process with the libraries loaded can see: the
// versions libddp was built with against those it loaded, peer access
// between the GPUs, and an all-reduce (its result and its bus bandwidth
// against the link's nominal rate). Rank 0 writes one check per line to
// $DDP_DOCTOR_REPORT: status, name, detail, fix, separated by tabs.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ATen/ATen.h>

#include <ddp/process_group.h>
#include <ddp/versions.h>

#if defined(DDP_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace {

struct Finding {
  std::string status, name, detail, fix;
};

/// major.minor as a number to compare: "12.8" -> 12008.
int version_number(const std::string& version) {
  int major = 0, minor = 0;
  std::sscanf(version.c_str(), "%d.%d", &major, &minor);
  return major * 1000 + minor;
}

std::vector<Finding> version_findings() {
  const ddp::Versions v = ddp::versions();
  const auto or_none = [](const std::string& text) { return text.empty() ? std::string("none") : text; };
  std::vector<Finding> found;
  found.push_back({"info", "libddp build",
                   fmt::format("libddp {}, LibTorch {}, CUDA {} (compiled) / {} (loaded) / {} (driver supports), "
                               "cuDNN {} (LibTorch's) / {} (loaded), NCCL {} (compiled) / {} (loaded), Gloo {}",
                               v.libddp, v.libtorch, or_none(v.cuda_compiled), or_none(v.cuda_runtime),
                               or_none(v.cuda_driver), or_none(v.cudnn_compiled), or_none(v.cudnn_runtime),
                               or_none(v.nccl_compiled), or_none(v.nccl_runtime), v.gloo ? "yes" : "no"),
                   ""});
  if (!v.cuda_runtime.empty() && !v.cuda_driver.empty() &&
      version_number(v.cuda_driver) < version_number(v.cuda_runtime)) {
    found.push_back(
        {"failure", "CUDA driver",
         fmt::format("the driver supports CUDA up to {}, but the runtime loaded is {}", v.cuda_driver, v.cuda_runtime),
         fmt::format("install an NVIDIA driver for CUDA {} or newer, or use a LibTorch built for CUDA {}",
                     v.cuda_runtime, v.cuda_driver)});
  }
  if (!v.nccl_runtime.empty() && version_number(v.nccl_runtime) != version_number(v.nccl_compiled)) {
    found.push_back({"warning", "NCCL",
                     fmt::format("compiled against NCCL {} but loaded {}", v.nccl_compiled, v.nccl_runtime),
                     "put the NCCL LibTorch ships with first on the library path (check LD_LIBRARY_PATH and "
                     "ldd libddp.so | grep nccl)"});
  }
  if (!v.cudnn_runtime.empty() &&
      v.cudnn_runtime.substr(0, v.cudnn_runtime.find('.')) != v.cudnn_compiled.substr(0, v.cudnn_compiled.find('.'))) {
    found.push_back({"warning", "cuDNN",
                     fmt::format("LibTorch was built with cuDNN {} but loaded {}", v.cudnn_compiled, v.cudnn_runtime),
                     "install the cuDNN major version LibTorch was built with, first on the library path"});
  }
  return found;
}

#if defined(DDP_WITH_CUDA)
/// GPU names and memory, and which pairs can reach each other directly.
std::vector<Finding> device_findings() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    return {{"info", "CUDA devices", "none visible to the CUDA runtime", ""}};
  }
  std::string devices;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    devices += fmt::format("{}{}: {} ({:.0f} GiB, sm_{}{})", d ? "; " : "", d, prop.name,
                           static_cast<double>(prop.totalGlobalMem) / (1 << 30), prop.major, prop.minor);
  }
  std::vector<Finding> found{{"ok", "CUDA devices", devices, ""}};
  if (count < 2) return found;
  std::vector<std::string> missing;
  for (int a = 0; a < count; ++a) {
    for (int b = a + 1; b < count; ++b) {
      int ab = 0, ba = 0;
      cudaDeviceCanAccessPeer(&ab, a, b);
      cudaDeviceCanAccessPeer(&ba, b, a);
      if (!ab || !ba) missing.push_back(fmt::format("{}-{}", a, b));
    }
  }
  if (missing.empty()) {
    found.push_back({"ok", "peer access", fmt::format("every pair of the {} GPUs", count), ""});
  } else {
    found.push_back(
        {"warning", "peer access",
         fmt::format("no direct access between GPUs {}: NCCL copies through host memory", fmt::join(missing, ", ")),
         "on bare metal enable peer access (IOMMU/ACS off for the GPUs' PCIe switches); in a VM, "
         "pass the GPUs through with peer access"});
  }
  return found;
}

/// The nominal bandwidth per GPU and direction, from nvidia-smi: the sum of
/// its active NVLinks, else its PCIe link. 0 if unknown.
double nominal_gbps(std::string& link) {
  double nvlink = 0;
  if (FILE* pipe = ::popen("nvidia-smi nvlink -s -i 0 2>/dev/null", "r")) {
    char line[512];
    while (std::fgets(line, sizeof(line), pipe) != nullptr) {
      double rate = 0;
      if (const char* colon = std::strchr(line, ':'); colon && std::sscanf(colon + 1, "%lf GB/s", &rate) == 1) {
        nvlink += rate;
      }
    }
    ::pclose(pipe);
  }
  if (nvlink > 0) {
    link = fmt::format("NVLink, {:.0f} GB/s per direction", nvlink);
    return nvlink;
  }
  int gen = 0, width = 0;
  if (FILE* pipe = ::popen(
          "nvidia-smi -i 0 --query-gpu=pcie.link.gen.max,pcie.link.width.max --format=csv,noheader 2>/dev/null", "r")) {
    if (std::fscanf(pipe, "%d, %d", &gen, &width) != 2) gen = 0;
    ::pclose(pipe);
  }
  const double per_lane[] = {0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.563};  // GB/s per direction
  if (gen < 1 || gen > 6) return 0;
  link = fmt::format("PCIe gen {} x{}, {:.0f} GB/s per direction", gen, width, per_lane[gen] * width);
  return per_lane[gen] * width;
}
#endif

/// An all-reduce of ones must give the world size everywhere; then its bus
/// bandwidth at a few sizes (nccl-tests' busbw: 2(n-1)/n of the bytes per second).
std::vector<Finding> all_reduce_findings(ddp::ProcessGroup& pg) {
  ddp::Communicator& comm = pg.communicator();
  const int world = comm.world_size();
  const auto options = at::TensorOptions().device(comm.device()).dtype(at::kFloat);
  at::Tensor ones = at::ones({1024}, options);
  comm.all_reduce(ones)->wait();
  const double min_value = ones.min().item<double>(), max_value = ones.max().item<double>();
  if (min_value != world || max_value != world) {
    return {
        {"failure", "all-reduce",
         fmt::format("a sum of ones over {} ranks gave {}..{} on rank {}", world, min_value, max_value, comm.rank()),
         "the transport corrupts data: rerun with NCCL_P2P_DISABLE=1, then NCCL_SHM_DISABLE=1, to find which "
         "one, and report it"}};
  }
  const std::string backend = comm.device().is_cuda() ? "NCCL" : "Gloo";
  if (world == 1) return {{"ok", "all-reduce", backend + ", one rank: correct (no bandwidth to measure)", ""}};
  std::vector<std::int64_t> sizes_mib =
      comm.device().is_cuda() ? std::vector<std::int64_t>{1, 32, 256} : std::vector<std::int64_t>{1, 16};
  std::string rates;
  [[maybe_unused]] double largest_busbw = 0;  // compared with the link on GPUs
  for (std::int64_t mib : sizes_mib) {
    at::Tensor data = at::ones({mib * (1 << 20) / 4}, options);
    const int iterations = comm.device().is_cuda() ? 20 : 5;
    for (int i = 0; i < 3; ++i) comm.all_reduce(data)->wait();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) comm.all_reduce(data)->wait();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
    const double busbw = static_cast<double>(data.nbytes()) / seconds / 1e9 * 2.0 * (world - 1) / world;
    rates += fmt::format("{}{} MiB {:.1f} GB/s", rates.empty() ? "" : ", ", mib, busbw);
    largest_busbw = busbw;
  }
  std::string detail = fmt::format("{}, {} ranks, correct; bus bandwidth {}", backend, world, rates);
#if defined(DDP_WITH_CUDA)
  if (comm.device().is_cuda()) {
    std::string link;
    const double nominal = nominal_gbps(link);
    if (nominal > 0) {
      const double share = largest_busbw / nominal;
      detail += fmt::format(" = {:.0f}% of the link ({})", 100 * share, link);
      if (share < 0.3) {
        return {{"warning", "all-reduce", detail,
                 "far below the link: check NCCL_P2P_DISABLE / NCCL_SHM_DISABLE, nvidia-smi topo -m (are the GPUs "
                 "behind the same switch?) and nvidia-smi nvlink -s (links down?)"}};
      }
    }
  }
#endif
  return {{"ok", "all-reduce", detail, ""}};
}

}  // namespace

int main() try {
  auto pg = ddp::init(ddp::InitOptions().timeout(std::chrono::seconds(60)));
  std::vector<Finding> found = version_findings();
#if defined(DDP_WITH_CUDA)
  for (Finding& f : device_findings()) found.push_back(std::move(f));
#endif
  for (Finding& f : all_reduce_findings(*pg)) found.push_back(std::move(f));
  if (pg->rank() == 0) {
    const char* path = std::getenv("DDP_DOCTOR_REPORT");
    std::ofstream out(path != nullptr ? path : "/dev/stdout");
    for (const Finding& f : found) out << f.status << '\t' << f.name << '\t' << f.detail << '\t' << f.fix << '\n';
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ddp_doctor_probe: %s\n", e.what());
  return 1;
}
