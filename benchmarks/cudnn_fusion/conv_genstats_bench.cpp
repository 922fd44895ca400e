// Does cuDNN 9's fusion of a convolution with the BatchNorm statistics of its
// output (GENSTATS: the per-channel sum and sum of squares, computed in the
// convolution's epilogue) beat a plain convolution followed by a separate
// statistics pass, for ResNet-50's convolutions in NHWC bf16?
//
// For each convolution of ResNet-50 (torchvision v1.5; the 3-channel stem is
// left out) at one batch:
//   (a)  ATen's cuDNN convolution (channels_last, benchmark mode);
//   (b)  (a) followed by at::batch_norm_stats of its output: what a training
//        step pays today for the convolution and its BatchNorm's statistics;
//   (c)  one cuDNN backend graph, CONVOLUTION_FORWARD -> GENSTATS, run as one
//        execution plan (the fused answer to (b));
//   (d)  the "ConvBNfprop" graph, relu(x * scale + bias) -> convolution ->
//        GENSTATS: the previous BatchNorm's apply and ReLU moved into the
//        convolution's prologue as well, against
//   (d') ATen's batch_norm_elemt + relu_ followed by (b).
// Each fused result is checked against ATen: y within bf16 rounding, the
// statistics against an fp32 reduction of ATen's output.
//
// Times are the device's: CUDA events around `iterations` back-to-back calls,
// enqueued behind a spinning kernel so that the host's cost per call does not
// show (a step captured in a CUDA graph, as ddp::CapturedStep records it, does
// not pay it either); the median of `trials`.
//
//   conv_genstats_bench [--batch 128] [--dtype bf16|fp16] [--iterations 50] [--warmup 10] [--trials 5]
//                       [--candidates 3] [--shapes resnet50|brief] [--no-sbr] [--json PATH]

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <fmt/format.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Sleep.h>
#include <ATen/cudnn/Handle.h>
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif

namespace {

// ---------------------------------------------------------------------------
// Checked calls. A failure names the call and where it was made, with cuDNN's
// own account of why (cudnnGetLastErrorString), which for an engine that
// cannot run a graph is the only explanation there is.

const char* file_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash != nullptr ? slash + 1 : path;
}

class CallFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string cudnn_failure(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return {};
  char detail[1024] = {};
#if CUDNN_MAJOR >= 9  // cuDNN 8 keeps no last error
  cudnnGetLastErrorString(detail, sizeof(detail));
#endif
  std::string message = fmt::format("{}:{}: {} failed: {}", file_name(file), line, call, cudnnGetErrorString(status));
  if (detail[0] != '\0') message += fmt::format(" ({})", detail);
  return message;
}

// For calls whose failure ends the measurement of a shape.
#define CUDNN_CHECK(call)                                                                                     \
  do {                                                                                                        \
    const cudnnStatus_t status_ = (call);                                                                     \
    if (status_ != CUDNN_STATUS_SUCCESS) throw CallFailed(cudnn_failure(status_, #call, __FILE__, __LINE__)); \
  } while (false)

// For calls whose failure is itself a result (an engine that cannot run the
// graph): "" on success, else the failure.
#define CUDNN_FAILURE_OF(call) cudnn_failure((call), #call, __FILE__, __LINE__)

#define CUDA_CHECK(call)                                                                              \
  do {                                                                                                \
    const cudaError_t error_ = (call);                                                                \
    if (error_ != cudaSuccess)                                                                        \
      throw CallFailed(fmt::format("{}:{}: {} failed: {} ({})", file_name(__FILE__), __LINE__, #call, \
                                   cudaGetErrorName(error_), cudaGetErrorString(error_)));            \
  } while (false)

#define SET(desc, name, type, count, values) \
  CUDNN_CHECK(cudnnBackendSetAttribute((desc).get(), name, type, count, values))
#define FINALIZE(desc) CUDNN_CHECK(cudnnBackendFinalize((desc).get()))

// ---------------------------------------------------------------------------
// Backend descriptors.

// Owns one backend descriptor. cuDNN documents no copy of the descriptors a
// plan is built from, so they are kept alive as long as the plan.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) { CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &desc_)); }
  Descriptor(Descriptor&& other) noexcept : desc_(std::exchange(other.desc_, nullptr)) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor& operator=(Descriptor&&) = delete;
  ~Descriptor() {
    if (desc_ == nullptr) return;
    const std::string failure = CUDNN_FAILURE_OF(cudnnBackendDestroyDescriptor(desc_));
    if (!failure.empty()) std::fprintf(stderr, "warning: %s\n", failure.c_str());  // a destructor cannot throw
  }
  cudnnBackendDescriptor_t get() const { return desc_; }

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
};

// Dimensions in cuDNN's order (N, C, H, W; K, C, R, S for filters) whatever
// the layout: the layout is in the strides.
using Dims = std::array<int64_t, 4>;

// channels_last / KRSC: C varies fastest, then W, H, N.
Dims nhwc_strides(const Dims& d) { return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]}; }

Descriptor tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, bool is_virtual) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const Dims strides = nhwc_strides(dims);
  // ATen's allocations are 512-byte aligned; 16 is what tensor-core engines ask for.
  const int64_t alignment = 16;
  SET(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  SET(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  SET(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  SET(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  SET(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  SET(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  FINALIZE(t);
  return t;
}

Descriptor pointwise(cudnnPointwiseMode_t mode) {
  Descriptor p(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
  SET(p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  SET(p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
  FINALIZE(p);
  return p;
}

// y = mode(x[, b]); b is null for a unary mode.
Descriptor pointwise_op(cudnnBackendDescriptor_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                        cudnnBackendDescriptor_t y) {
  Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  SET(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mode);
  SET(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  if (b != nullptr) SET(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  SET(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  FINALIZE(op);
  return op;
}

// ---------------------------------------------------------------------------
// The convolutions.

struct Conv {
  const char* where;
  int64_t c, k, side, kernel, stride;
  int count;   // how many of ResNet-50's 52 measured convolutions have this shape
  bool brief;  // one of the seven shapes --shapes brief keeps
  int64_t pad() const { return kernel / 2; }
  int64_t out_side() const { return (side + 2 * pad() - kernel) / stride + 1; }
  std::string shape() const {
    return fmt::format("{}x{} {}->{} @{}{}", kernel, kernel, c, k, side,
                       stride == 1 ? "" : fmt::format(" /{}", stride));
  }
};

// ResNet-50 v1.5 (stride in the 3x3 convolution), each bottleneck's convolutions,
// every one of which is followed by a BatchNorm.
const std::vector<Conv> kConvs{
    {"layer1.0 conv1", 64, 64, 56, 1, 1, 1, false},        {"layer1 conv1", 256, 64, 56, 1, 1, 2, true},
    {"layer1 conv2", 64, 64, 56, 3, 1, 3, true},           {"layer1 conv3, downsample", 64, 256, 56, 1, 1, 4, true},
    {"layer2.0 conv1", 256, 128, 56, 1, 1, 1, false},      {"layer2.0 conv2", 128, 128, 56, 3, 2, 1, false},
    {"layer2 downsample", 256, 512, 56, 1, 2, 1, false},   {"layer2 conv1", 512, 128, 28, 1, 1, 3, true},
    {"layer2 conv2", 128, 128, 28, 3, 1, 3, true},         {"layer2 conv3", 128, 512, 28, 1, 1, 4, false},
    {"layer3.0 conv1", 512, 256, 28, 1, 1, 1, false},      {"layer3.0 conv2", 256, 256, 28, 3, 2, 1, false},
    {"layer3 downsample", 512, 1024, 28, 1, 2, 1, false},  {"layer3 conv1", 1024, 256, 14, 1, 1, 5, false},
    {"layer3 conv2", 256, 256, 14, 3, 1, 5, true},         {"layer3 conv3", 256, 1024, 14, 1, 1, 6, false},
    {"layer4.0 conv1", 1024, 512, 14, 1, 1, 1, false},     {"layer4.0 conv2", 512, 512, 14, 3, 2, 1, false},
    {"layer4 downsample", 1024, 2048, 14, 1, 2, 1, false}, {"layer4 conv1", 2048, 512, 7, 1, 1, 2, false},
    {"layer4 conv2", 512, 512, 7, 3, 1, 2, true},          {"layer4 conv3", 512, 2048, 7, 1, 1, 3, false},
};

// Unique ids of the graphs' tensors; the virtual ones only link operations.
enum Uid : int64_t { kX = 1, kW, kY, kSum, kSqSum, kScale, kBias, kScaled = 101, kBiased, kActivated };

// The operation graph of (c), or of (d) when `param_type` is given (the type
// of the per-channel scale and bias). Every descriptor it is made of goes
// into `keep`.
Descriptor operation_graph(cudnnHandle_t handle, const Conv& conv, int64_t batch, cudnnDataType_t io_type,
                           std::optional<cudnnDataType_t> param_type, std::vector<Descriptor>& keep) {
  const auto kept = [&keep](Descriptor d) {
    keep.push_back(std::move(d));
    return keep.back().get();
  };
  const Dims x_dims{batch, conv.c, conv.side, conv.side};
  const Dims w_dims{conv.k, conv.c, conv.kernel, conv.kernel};
  const Dims y_dims{batch, conv.k, conv.out_side(), conv.out_side()};
  const Dims stat_dims{1, conv.k, 1, 1};
  const Dims param_dims{1, conv.c, 1, 1};

  cudnnBackendDescriptor_t x = kept(tensor(kX, io_type, x_dims, false));
  cudnnBackendDescriptor_t w = kept(tensor(kW, io_type, w_dims, false));
  // Y is real: the next BatchNorm's apply step reads it.
  cudnnBackendDescriptor_t y = kept(tensor(kY, io_type, y_dims, false));
  cudnnBackendDescriptor_t sum = kept(tensor(kSum, CUDNN_DATA_FLOAT, stat_dims, false));
  cudnnBackendDescriptor_t sqsum = kept(tensor(kSqSum, CUDNN_DATA_FLOAT, stat_dims, false));
  std::vector<cudnnBackendDescriptor_t> ops;

  cudnnBackendDescriptor_t conv_input = x;
  if (param_type) {
    // relu(x * scale + bias), intermediates in fp32 as the ConvBNfprop samples have them.
    cudnnBackendDescriptor_t scale = kept(tensor(kScale, *param_type, param_dims, false));
    cudnnBackendDescriptor_t bias = kept(tensor(kBias, *param_type, param_dims, false));
    cudnnBackendDescriptor_t scaled = kept(tensor(kScaled, CUDNN_DATA_FLOAT, x_dims, true));
    cudnnBackendDescriptor_t biased = kept(tensor(kBiased, CUDNN_DATA_FLOAT, x_dims, true));
    cudnnBackendDescriptor_t activated = kept(tensor(kActivated, CUDNN_DATA_FLOAT, x_dims, true));
    cudnnBackendDescriptor_t mul = kept(pointwise(CUDNN_POINTWISE_MUL));
    cudnnBackendDescriptor_t add = kept(pointwise(CUDNN_POINTWISE_ADD));
    cudnnBackendDescriptor_t relu = kept(pointwise(CUDNN_POINTWISE_RELU_FWD));
    ops.push_back(kept(pointwise_op(mul, x, scale, scaled)));
    ops.push_back(kept(pointwise_op(add, scaled, bias, biased)));
    ops.push_back(kept(pointwise_op(relu, biased, nullptr, activated)));
    conv_input = activated;
  }

  Descriptor convolution(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t accumulate = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;  // what every framework calls a convolution
  const int64_t spatial_dims = 2;
  const std::array<int64_t, 2> dilation{1, 1}, stride{conv.stride, conv.stride}, padding{conv.pad(), conv.pad()};
  SET(convolution, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &accumulate);
  SET(convolution, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  SET(convolution, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial_dims);
  SET(convolution, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation.data());
  SET(convolution, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride.data());
  SET(convolution, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, padding.data());
  SET(convolution, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, padding.data());
  FINALIZE(convolution);
  cudnnBackendDescriptor_t convolution_desc = kept(std::move(convolution));

  // y = 1 * conv(x, w) + 0 * y: fusion engines take no other alpha and beta.
  Descriptor forward(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  const float alpha = 1.0f, beta = 0.0f;
  SET(forward, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
  SET(forward, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  SET(forward, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv_input);
  SET(forward, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
  SET(forward, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  SET(forward, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &convolution_desc);
  FINALIZE(forward);
  ops.push_back(kept(std::move(forward)));

  Descriptor genstats(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
  const cudnnGenStatsMode_t stats_mode = CUDNN_GENSTATS_SUM_SQSUM;
  const cudnnDataType_t stats_precision = CUDNN_DATA_FLOAT;
  SET(genstats, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &stats_mode);
  SET(genstats, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &stats_precision);
  SET(genstats, CUDNN_ATTR_OPERATION_GENSTATS_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  SET(genstats, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &sum);
  SET(genstats, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &sqsum);
  FINALIZE(genstats);
  ops.push_back(kept(std::move(genstats)));

  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  SET(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  SET(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()),
      ops.data());
  FINALIZE(graph);
  return graph;
}

// ---------------------------------------------------------------------------
// Engines and plans.

// A finalized plan, with the engine configuration it was made from.
struct Candidate {
  Candidate(Descriptor config_, Descriptor plan_, std::string source_)
      : config(std::move(config_)), plan(std::move(plan_)), source(std::move(source_)) {}
  Descriptor config, plan;
  std::vector<Descriptor> keep;  // the engine, where the configuration was made here
  std::string source;            // "heuristics A #0": which list, which rank
  int64_t engine = -1;           // cuDNN's global engine index
  int64_t workspace_bytes = 0;
  bool runtime_compiled = false;  // CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION: a kernel generated for this graph
  double tuning_ms = 0;
};

// Failures of the engines tried, summarised for the line that says why no plan exists.
struct Attempts {
  int tried = 0;
  std::string last_failure;
  std::string log;
};

std::optional<Candidate> make_plan(cudnnHandle_t handle, Descriptor config, std::string source, Attempts& attempts) {
  ++attempts.tried;
  Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  cudnnBackendDescriptor_t raw_config = config.get();
  SET(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  SET(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw_config);
  // A runtime-fusion engine generates and compiles its kernel here (seconds).
  const std::string failure = CUDNN_FAILURE_OF(cudnnBackendFinalize(plan.get()));
  if (!failure.empty()) {
    attempts.last_failure = failure;
    return std::nullopt;
  }
  Candidate candidate(std::move(config), std::move(plan), std::move(source));
  int64_t count = 0;
  CUDNN_CHECK(cudnnBackendGetAttribute(candidate.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                       1, &count, &candidate.workspace_bytes));
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw_engine = engine.get();
  CUDNN_CHECK(cudnnBackendGetAttribute(candidate.config.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &raw_engine));
  CUDNN_CHECK(cudnnBackendGetAttribute(raw_engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count,
                                       &candidate.engine));
  // Only informative: an engine that cannot list its notes is still measured.
  std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> notes{};
  const std::string notes_failure =
      CUDNN_FAILURE_OF(cudnnBackendGetAttribute(raw_engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                                static_cast<int64_t>(notes.size()), &count, notes.data()));
  if (notes_failure.empty()) {
    const auto end = notes.begin() + std::clamp<int64_t>(count, 0, static_cast<int64_t>(notes.size()));
    candidate.runtime_compiled = std::find(notes.begin(), end, CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) != end;
  }
  candidate.keep.push_back(std::move(engine));
  return candidate;
}

// The engine configurations one heuristics mode ranks for the graph, best first.
std::vector<Descriptor> heuristic_configs(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                                          std::string& failure) {
  std::vector<Descriptor> configs;
  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  SET(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  SET(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  failure = CUDNN_FAILURE_OF(cudnnBackendFinalize(heuristics.get()));
  if (!failure.empty()) return configs;
  int64_t count = 0;
  CUDNN_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       0, &count, nullptr));
  // The results are copied into descriptors the caller has created.
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t returned = 0;
  CUDNN_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       count, &returned, raw.data()));
  while (static_cast<int64_t>(configs.size()) > returned) configs.pop_back();
  return configs;
}

// Up to `wanted` plans for the graph: from heuristics mode A's list, else
// FALLBACK's, else from every engine cuDNN has, so that "none" means that no
// engine of this cuDNN on this GPU runs the graph.
std::vector<Candidate> find_plans(cudnnHandle_t handle, cudnnBackendDescriptor_t graph, int wanted,
                                  Attempts& attempts) {
  std::vector<Candidate> found;
  const std::array<std::pair<cudnnBackendHeurMode_t, const char*>, 2> modes{
      {{CUDNN_HEUR_MODE_A, "A"}, {CUDNN_HEUR_MODE_FALLBACK, "FALLBACK"}}};
  // Enough to find those that finalize, not so many that compiling rejects takes minutes.
  constexpr size_t kMostConfigsTried = 24;
  for (const auto& [mode, name] : modes) {
    std::string failure;
    std::vector<Descriptor> configs = heuristic_configs(graph, mode, failure);
    if (!failure.empty()) {
      attempts.log += fmt::format("heuristics {}: {}; ", name, failure);
      continue;
    }
    const int tried_before = attempts.tried;
    for (size_t i = 0; i < configs.size() && i < kMostConfigsTried && static_cast<int>(found.size()) < wanted; ++i) {
      std::optional<Candidate> candidate =
          make_plan(handle, std::move(configs[i]), fmt::format("heuristics {} #{}", name, i), attempts);
      if (candidate) found.push_back(std::move(*candidate));
    }
    attempts.log += fmt::format("heuristics {}: {} configs, {} tried, {} finalized; ", name, configs.size(),
                                attempts.tried - tried_before, found.size());
    if (!found.empty()) return found;
  }

  int64_t engine_count = 0, count = 0;
  CUDNN_CHECK(cudnnBackendGetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1,
                                       &count, &engine_count));
  int supporting = 0;
  for (int64_t index = 0; index < engine_count && static_cast<int>(found.size()) < wanted; ++index) {
    Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    SET(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    SET(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index);
    // An engine that does not support the graph refuses to finalize.
    std::string failure = CUDNN_FAILURE_OF(cudnnBackendFinalize(engine.get()));
    if (!failure.empty()) {
      attempts.last_failure = failure;
      continue;
    }
    ++supporting;
    Descriptor config(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    cudnnBackendDescriptor_t raw_engine = engine.get();
    SET(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw_engine);
    failure = CUDNN_FAILURE_OF(cudnnBackendFinalize(config.get()));
    if (!failure.empty()) {
      attempts.last_failure = failure;
      continue;
    }
    std::optional<Candidate> candidate =
        make_plan(handle, std::move(config), fmt::format("engine {} (no heuristics)", index), attempts);
    if (candidate) {
      candidate->keep.push_back(std::move(engine));
      found.push_back(std::move(*candidate));
    }
  }
  attempts.log +=
      fmt::format("every engine: {} of {} accept the graph, {} finalized", supporting, engine_count, found.size());
  return found;
}

Descriptor variant_pack(const std::vector<int64_t>& uids, const std::vector<void*>& pointers, void* workspace) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  SET(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data());
  SET(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
      pointers.data());
  SET(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  FINALIZE(pack);
  return pack;
}

// ---------------------------------------------------------------------------
// Timing.

class Event {
 public:
  Event() { CUDA_CHECK(cudaEventCreate(&event_)); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    const cudaError_t error = cudaEventDestroy(event_);
    if (error != cudaSuccess) std::fprintf(stderr, "warning: cudaEventDestroy: %s\n", cudaGetErrorString(error));
  }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

struct Timing {
  int warmup, iterations, trials;
};

// About 100 us of spinning per call at H100/H200 clocks: longer than the host
// takes to enqueue the heaviest body here (ATen's convolution + statistics).
constexpr int64_t kSpinCyclesPerCall = 200'000;

double median_ms_per_call(const Timing& timing, const std::function<void()>& body) {
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  for (int i = 0; i < timing.warmup; ++i) body();
  CUDA_CHECK(cudaStreamSynchronize(stream));
  Event start, stop;
  std::vector<double> per_call;
  for (int trial = 0; trial < timing.trials; ++trial) {
    at::cuda::sleep(kSpinCyclesPerCall * timing.iterations);
    CUDA_CHECK(cudaEventRecord(start.get(), stream));
    for (int i = 0; i < timing.iterations; ++i) body();
    CUDA_CHECK(cudaEventRecord(stop.get(), stream));
    CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    per_call.push_back(static_cast<double>(ms) / timing.iterations);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

// ---------------------------------------------------------------------------
// Checks.

struct Check {
  double y_max_abs_diff = NAN, y_tolerance = NAN, sum_error = NAN, sqsum_error = NAN;
  bool pass = false;
  std::string str() const {
    return fmt::format("{} (|dy| {:.3g} of {:.3g}, sum {:.2g}, sqsum {:.2g})", pass ? "PASS" : "FAIL", y_max_abs_diff,
                       y_tolerance, sum_error, sqsum_error);
  }
};

// Largest difference over largest reference: per-channel sums of a centred
// output can be near zero, where an elementwise relative error means nothing.
double relative_error(const at::Tensor& value, const at::Tensor& reference) {
  return ((value - reference).abs().max() / reference.abs().max().clamp_min(1e-30)).item<double>();
}

// `stats` holds sum and sqsum as its two rows.
Check check(const at::Tensor& y, const at::Tensor& stats, const at::Tensor& y_reference) {
  Check c;
  const at::Tensor reference = y_reference.to(at::kFloat);
  c.y_max_abs_diff = (y.to(at::kFloat) - reference).abs().max().item<double>();
  // Two units in the last place of bf16 at the output's largest magnitude:
  // cuDNN's engines sum in other orders and may round once more or less.
  c.y_tolerance = 2.0 / 128 * reference.abs().max().item<double>();
  c.sum_error = relative_error(stats[0], reference.sum({0, 2, 3}));
  c.sqsum_error = relative_error(stats[1], reference.square().sum({0, 2, 3}));
  c.pass = c.y_max_abs_diff <= c.y_tolerance && c.sum_error <= 1e-2 && c.sqsum_error <= 1e-2;
  return c;
}

void expect_nhwc(const at::Tensor& t, const char* name) {
  const Dims dims{t.size(0), t.size(1), t.size(2), t.size(3)};
  const Dims want = nhwc_strides(dims);
  for (int i = 0; i < 4; ++i) {
    if (dims[i] != 1 && t.stride(i) != want[i]) {
      throw std::runtime_error(
          fmt::format("{} is not NHWC: stride {} of dimension {}, not {}", name, t.stride(i), i, want[i]));
    }
  }
}

// ---------------------------------------------------------------------------
// One fused graph, (c) or (d): plan, check, time.

struct Fused {
  bool supported = false;
  std::string why_not;  // the engines' answers when no plan exists, or the error that stopped the measurement
  std::string log;      // how the plan was found
  double ms = NAN;
  int64_t engine = -1, workspace_bytes = 0;
  bool runtime_compiled = false;
  bool accumulates = false;  // whether GENSTATS adds to sum/sqsum rather than writing them
  std::string source;
  Check check;
  std::string param_type;  // (d): the scale's and bias' type the plan was made for
};

struct FusedInputs {
  at::Tensor x, w, scale, bias;  // scale and bias: (d) only
  at::Tensor y_reference;        // ATen's output for the same input
};

Fused run_fused(cudnnHandle_t handle, const Conv& conv, int64_t batch, cudnnDataType_t io_type,
                std::optional<cudnnDataType_t> param_type, const FusedInputs& in, int candidates,
                const Timing& timing) {
  Fused result;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  CUDNN_CHECK(cudnnSetStream(handle, stream));

  std::vector<Descriptor> keep;
  Descriptor graph = operation_graph(handle, conv, batch, io_type, param_type, keep);
  Attempts attempts;
  std::vector<Candidate> plans = find_plans(handle, graph.get(), candidates, attempts);
  result.log = attempts.log;
  if (plans.empty()) {
    result.why_not = fmt::format("not supported on this GPU/cuDNN: {}{}", attempts.log,
                                 attempts.last_failure.empty() ? "" : "; last refusal: " + attempts.last_failure);
    return result;
  }

  const at::Tensor y = at::empty_like(in.y_reference);
  const at::Tensor stats = at::zeros({2, conv.k}, y.options().dtype(at::kFloat));
  float* const sum = stats.data_ptr<float>();
  std::vector<int64_t> uids{kX, kW, kY, kSum, kSqSum};
  std::vector<void*> pointers{in.x.data_ptr(), in.w.data_ptr(), y.data_ptr(), sum, sum + conv.k};
  if (param_type) {
    uids.insert(uids.end(), {kScale, kBias});
    pointers.insert(pointers.end(), {in.scale.data_ptr(), in.bias.data_ptr()});
  }

  // The fastest of the candidates on a short run, since ATen's side is tuned too (benchmark mode).
  std::vector<at::Tensor> workspaces;
  std::vector<Descriptor> packs;
  for (Candidate& plan : plans) {
    workspaces.push_back(at::empty({std::max<int64_t>(plan.workspace_bytes, 1)}, y.options().dtype(at::kByte)));
    packs.push_back(variant_pack(uids, pointers, plan.workspace_bytes > 0 ? workspaces.back().data_ptr() : nullptr));
    const cudnnBackendDescriptor_t raw_plan = plan.plan.get(), raw_pack = packs.back().get();
    plan.tuning_ms = plans.size() == 1 ? 0 : median_ms_per_call({2, std::max(timing.iterations / 5, 1), 1}, [&] {
      CUDNN_CHECK(cudnnBackendExecute(handle, raw_plan, raw_pack));
    });
  }
  size_t best = 0;
  for (size_t i = 1; i < plans.size(); ++i) {
    if (plans[i].tuning_ms < plans[best].tuning_ms) best = i;
  }
  const cudnnBackendDescriptor_t plan = plans[best].plan.get(), pack = packs[best].get();
  result.supported = true;
  result.engine = plans[best].engine;
  result.workspace_bytes = plans[best].workspace_bytes;
  result.runtime_compiled = plans[best].runtime_compiled;
  result.source = plans[best].source;

  CUDA_CHECK(cudaMemsetAsync(sum, 0, stats.nbytes(), stream));
  CUDNN_CHECK(cudnnBackendExecute(handle, plan, pack));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  result.check = check(y, stats, in.y_reference);
  // Whether the statistics must be zeroed before each run: the documentation does not say.
  const at::Tensor first = stats.clone();
  CUDNN_CHECK(cudnnBackendExecute(handle, plan, pack));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  result.accumulates = relative_error(stats, 2 * first) < 1e-3 && relative_error(stats, first) > 0.5;

  result.ms = median_ms_per_call(timing, [&] {
    if (result.accumulates) CUDA_CHECK(cudaMemsetAsync(sum, 0, stats.nbytes(), stream));
    CUDNN_CHECK(cudnnBackendExecute(handle, plan, pack));
  });
  return result;
}

// ---------------------------------------------------------------------------
// Output.

std::string json_escape(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(ch));
    } else {
      out += ch;
    }
  }
  return out;
}

class JsonLine {
 public:
  JsonLine& text(const char* key, const std::string& value) { return raw(key, '"' + json_escape(value) + '"'); }
  JsonLine& number(const char* key, double value) {
    return raw(key, std::isfinite(value) ? fmt::format("{:.6g}", value) : "null");
  }
  JsonLine& integer(const char* key, int64_t value) { return raw(key, std::to_string(value)); }
  JsonLine& boolean(const char* key, bool value) { return raw(key, value ? "true" : "false"); }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  JsonLine& raw(const char* key, const std::string& value) {
    if (!body_.empty()) body_ += ',';
    body_ += fmt::format("\"{}\":{}", key, value);
    return *this;
  }
  std::string body_;
};

void add_fused(JsonLine& line, const std::string& prefix, const Fused& fused) {
  line.boolean((prefix + "_supported").c_str(), fused.supported)
      .number((prefix + "_ms").c_str(), fused.ms)
      .integer((prefix + "_engine").c_str(), fused.engine)
      .integer((prefix + "_workspace_bytes").c_str(), fused.workspace_bytes)
      .boolean((prefix + "_runtime_compiled").c_str(), fused.runtime_compiled)
      .boolean((prefix + "_accumulates").c_str(), fused.accumulates)
      .text((prefix + "_plan").c_str(), fused.source)
      .boolean((prefix + "_pass").c_str(), fused.supported && fused.check.pass)
      .number((prefix + "_y_max_abs_diff").c_str(), fused.check.y_max_abs_diff)
      .number((prefix + "_sum_rel_error").c_str(), fused.check.sum_error)
      .number((prefix + "_sqsum_rel_error").c_str(), fused.check.sqsum_error)
      .text((prefix + "_why_not").c_str(), fused.why_not);
}

std::string ms_or_dash(double ms) { return std::isfinite(ms) ? fmt::format("{:.3f}", ms) : "-"; }

std::string ratio_or_dash(double a, double b) {
  return std::isfinite(a) && std::isfinite(b) && b > 0 ? fmt::format("{:.2f}", a / b) : "-";
}

std::string plan_summary(const Fused& fused) {
  if (!fused.supported) {
    if (fused.why_not.empty()) return "-";
    return fused.why_not.find("not supported") != std::string::npos ? "NOT SUPPORTED (see notes)" : "error (see notes)";
  }
  return fmt::format("engine {}{}, ws {} KiB{}{}", fused.engine, fused.runtime_compiled ? " (runtime-compiled)" : "",
                     (fused.workspace_bytes + 1023) / 1024, fused.accumulates ? ", accumulates" : "",
                     fused.param_type.empty() ? "" : ", params " + fused.param_type);
}

// ---------------------------------------------------------------------------
// Flags.

struct Options {
  int64_t batch = 128;
  std::string dtype = "bf16";
  int iterations = 50, warmup = 10, trials = 5, candidates = 3;
  std::string shapes = "resnet50";
  bool sbr = true;
  std::string json;
};

[[noreturn]] void usage(const std::string& error) {
  std::fprintf(stderr,
               "%s%sconv_genstats_bench [--batch 128] [--dtype bf16|fp16] [--iterations 50] [--warmup 10] "
               "[--trials 5]\n"
               "                    [--candidates 3] [--shapes resnet50|brief] [--no-sbr] [--json PATH]\n"
               "  --candidates K  plans finalized per graph, the fastest on a short run kept (1: heuristics' first)\n"
               "  --shapes        resnet50: every bottleneck convolution; brief: seven of them\n"
               "  --no-sbr        skip (d), the scale-bias-ReLU prologue\n",
               error.c_str(), error.empty() ? "" : "\n");
  std::exit(error.empty() ? 0 : 2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    const size_t equals = name.find('=');
    const auto next = [&]() -> std::string {
      if (equals != std::string::npos) return name.substr(equals + 1);
      if (i + 1 >= argc) usage(name + " needs a value");
      return argv[++i];
    };
    const std::string flag = name.substr(0, equals);
    const auto integer = [&](int64_t min) {
      const std::string text = next();
      char* end = nullptr;
      const long long parsed = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || parsed < min)
        usage(fmt::format("{}: {} is not an integer >= {}", flag, text, min));
      return static_cast<int64_t>(parsed);
    };
    if (flag == "--help" || flag == "-h")
      usage("");
    else if (flag == "--batch")
      o.batch = integer(1);
    else if (flag == "--dtype")
      o.dtype = next();
    else if (flag == "--iterations")
      o.iterations = static_cast<int>(integer(1));
    else if (flag == "--warmup")
      o.warmup = static_cast<int>(integer(0));
    else if (flag == "--trials")
      o.trials = static_cast<int>(integer(1));
    else if (flag == "--candidates")
      o.candidates = static_cast<int>(integer(1));
    else if (flag == "--shapes")
      o.shapes = next();
    else if (flag == "--no-sbr")
      o.sbr = false;
    else if (flag == "--json")
      o.json = next();
    else
      usage("unknown flag " + flag);
  }
  if (o.dtype != "bf16" && o.dtype != "fp16") usage("--dtype: bf16 or fp16");
  if (o.shapes != "resnet50" && o.shapes != "brief") usage("--shapes: resnet50 or brief");
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options options = parse(argc, argv);
  const Timing timing{options.warmup, options.iterations, options.trials};
  const bool bf16 = options.dtype == "bf16";
  const at::ScalarType io_dtype = bf16 ? at::kBFloat16 : at::kHalf;
  const cudnnDataType_t io_type = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;

  int device = 0, runtime = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  const size_t cudnn_runtime = cudnnGetVersion();
  const char* commit = std::getenv("DDP_GIT_COMMIT");
  fmt::print("{} (sm_{}{}, {} SMs); cuDNN {} (headers {}); LibTorch {}; CUDA runtime {}; commit {}\n", prop.name,
             prop.major, prop.minor, prop.multiProcessorCount, cudnn_runtime, CUDNN_VERSION, TORCH_VERSION, runtime,
             commit != nullptr ? commit : "unknown");
  fmt::print(
      "batch {}, {} NHWC, fp32 accumulation; median of {} trials of {} calls; {} candidate plan(s) per graph\n\n",
      options.batch, options.dtype, options.trials, options.iterations, options.candidates);

  at::manual_seed(0);
  // Benchmark mode for every ATen convolution, as a training run sets it.
  at::globalContext().setBenchmarkCuDNN(true);
  const cudnnHandle_t handle = at::native::getCudnnHandle();
  std::ofstream json;
  if (!options.json.empty()) {
    json.open(options.json);
    if (!json) throw std::runtime_error("cannot write " + options.json);
  }

  fmt::print(
      "| convolution | shape | n | (a) conv | (b) conv+stats | (c) fused | (c)/(b) | (c) plan | (c) check | (d) fused "
      "SBR | (d') ATen SBR | (d)/(d') | (d) plan | (d) check |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  struct Total {
    double unfused = 0, fused = 0;
    int convs = 0;
  } total_c, total_d;
  std::vector<std::string> notes;

  for (const Conv& conv : kConvs) {
    if (options.shapes == "brief" && !conv.brief) continue;
    double aten_ms = NAN, aten_stats_ms = NAN, aten_sbr_ms = NAN;
    Fused c, d;
    try {
      const auto io = at::TensorOptions().device(at::kCUDA).dtype(io_dtype);
      const auto fp32 = io.dtype(at::kFloat);
      const auto channels_last = at::MemoryFormat::ChannelsLast;
      // A ReLU's output, as a bottleneck's convolutions see it; Kaiming-scaled
      // weights keep y near unit range, where bf16's rounding is what it is in training.
      const at::Tensor x =
          at::randn({options.batch, conv.c, conv.side, conv.side}, fp32).abs_().to(io_dtype).contiguous(channels_last);
      const at::Tensor w = (at::randn({conv.k, conv.c, conv.kernel, conv.kernel}, fp32) /
                            std::sqrt(static_cast<double>(conv.c * conv.kernel * conv.kernel)))
                               .to(io_dtype)
                               .contiguous(channels_last);
      const auto aten_conv = [&](const at::Tensor& input) {
        return at::cudnn_convolution(input, w, {conv.pad(), conv.pad()}, {conv.stride, conv.stride}, {1, 1},
                                     /*groups=*/1, /*benchmark=*/true, /*deterministic=*/false, /*allow_tf32=*/true);
      };
      const at::Tensor y_reference = aten_conv(x);
      expect_nhwc(x, "x");
      expect_nhwc(w, "w");
      expect_nhwc(y_reference, "ATen's convolution output");
      constexpr double kEps = 1e-5;

      aten_ms = median_ms_per_call(timing, [&] { aten_conv(x); });
      aten_stats_ms = median_ms_per_call(timing, [&] { at::batch_norm_stats(aten_conv(x), kEps); });
      try {
        c = run_fused(handle, conv, options.batch, io_type, std::nullopt, {x, w, {}, {}, y_reference},
                      options.candidates, timing);
      } catch (const std::exception& e) {
        c.why_not = e.what();
      }

      if (options.sbr) {
        const at::Tensor scale = at::rand({1, conv.c, 1, 1}, fp32) + 0.5;
        const at::Tensor bias = at::randn({1, conv.c, 1, 1}, fp32) * 0.5;
        // fp32 parameters first, as BatchNorm keeps them; the samples of the
        // pattern use the data's type, so that is tried when fp32 has no engine.
        std::string refusals;
        for (const auto& [param_type, param_dtype, name] :
             {std::tuple{CUDNN_DATA_FLOAT, at::kFloat, "fp32"}, std::tuple{io_type, io_dtype, options.dtype.c_str()}}) {
          const at::Tensor s = scale.to(param_dtype), b = bias.to(param_dtype);
          const at::Tensor x_activated =
              at::relu(x.to(at::kFloat) * s.to(at::kFloat) + b.to(at::kFloat)).to(io_dtype).contiguous(channels_last);
          try {
            d = run_fused(handle, conv, options.batch, io_type, param_type, {x, w, s, b, aten_conv(x_activated)},
                          options.candidates, timing);
          } catch (const std::exception& e) {
            d = Fused{};
            d.why_not = e.what();
          }
          d.param_type = name;
          if (d.supported) break;
          refusals += fmt::format("{}[{} scale and bias] {}", refusals.empty() ? "" : "; ", name, d.why_not);
        }
        if (!d.supported) d.why_not = refusals;
        try {
          const at::Tensor scale_c = scale.view({conv.c}), bias_c = bias.view({conv.c});
          const at::Tensor zero = at::zeros({conv.c}, fp32), one = at::ones({conv.c}, fp32);
          aten_sbr_ms = median_ms_per_call(timing, [&] {
            at::Tensor activated = at::batch_norm_elemt(x, scale_c, bias_c, zero, one, kEps);
            at::relu_(activated);
            at::batch_norm_stats(aten_conv(activated), kEps);
          });
        } catch (const std::exception& e) {
          notes.push_back(fmt::format("{} (d'): {}", conv.where, e.what()));
        }
      }
    } catch (const std::exception& e) {
      notes.push_back(fmt::format("{}: {}", conv.where, e.what()));
    }

    fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", conv.where, conv.shape(),
               conv.count, ms_or_dash(aten_ms), ms_or_dash(aten_stats_ms), ms_or_dash(c.ms),
               ratio_or_dash(c.ms, aten_stats_ms), plan_summary(c), c.supported ? c.check.str() : "-", ms_or_dash(d.ms),
               ms_or_dash(aten_sbr_ms), ratio_or_dash(d.ms, aten_sbr_ms), options.sbr ? plan_summary(d) : "skipped",
               d.supported ? d.check.str() : "-");
    std::fflush(stdout);
    if (!c.why_not.empty()) notes.push_back(fmt::format("{} (c): {}", conv.where, c.why_not));
    if (options.sbr && !d.why_not.empty()) notes.push_back(fmt::format("{} (d): {}", conv.where, d.why_not));
    if (c.supported && std::isfinite(aten_stats_ms)) {
      total_c.unfused += conv.count * aten_stats_ms;
      total_c.fused += conv.count * c.ms;
      total_c.convs += conv.count;
    }
    if (d.supported && std::isfinite(aten_sbr_ms)) {
      total_d.unfused += conv.count * aten_sbr_ms;
      total_d.fused += conv.count * d.ms;
      total_d.convs += conv.count;
    }

    if (json.is_open()) {
      JsonLine line;
      line.text("gpu", prop.name)
          .integer("cudnn", static_cast<int64_t>(cudnn_runtime))
          .text("torch", TORCH_VERSION)
          .text("commit", commit != nullptr ? commit : "unknown")
          .text("dtype", options.dtype)
          .text("conv", conv.where)
          .integer("n", options.batch)
          .integer("c", conv.c)
          .integer("k", conv.k)
          .integer("hw", conv.side)
          .integer("kernel", conv.kernel)
          .integer("stride", conv.stride)
          .integer("count", conv.count)
          .number("aten_conv_ms", aten_ms)
          .number("aten_conv_stats_ms", aten_stats_ms)
          .number("fused_over_unfused", c.supported ? c.ms / aten_stats_ms : NAN)
          .number("aten_sbr_conv_stats_ms", aten_sbr_ms);
      add_fused(line, "fused", c);
      if (options.sbr) {
        add_fused(line, "sbr_fused", d);
        line.text("sbr_param_type", d.param_type);
      }
      json << line.str() << '\n';
      json.flush();
    }
  }

  // What the question comes down to: the whole forward pass's convolutions
  // with their statistics, each shape weighted by how often ResNet-50 runs it.
  fmt::print("\n");
  if (total_c.convs > 0) {
    fmt::print("(c) over {} of ResNet-50's convolutions: ATen conv + stats {:.3f} ms, fused {:.3f} ms ({:.2f}x)\n",
               total_c.convs, total_c.unfused, total_c.fused, total_c.fused / total_c.unfused);
  } else {
    fmt::print("(c) ran for no shape: no engine of this cuDNN runs convolution + GENSTATS here (see below)\n");
  }
  if (total_d.convs > 0) {
    fmt::print(
        "(d) over {} of ResNet-50's convolutions: ATen SBR + conv + stats {:.3f} ms, fused {:.3f} ms ({:.2f}x)\n",
        total_d.convs, total_d.unfused, total_d.fused, total_d.fused / total_d.unfused);
  }
  if (!notes.empty()) fmt::print("\nNotes:\n");
  for (const std::string& note : notes) fmt::print("- {}\n", note);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "conv_genstats_bench: %s\n", e.what());
  return 1;
}
