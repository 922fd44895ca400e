#include "checkpoint/optimizer_state.h"

#include <map>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <ddp/errors.h>
#include <ddp/optim.h>

#include "checkpoint/archive_entry.h"
#include "checkpoint/optimizer_param_state.h"
#include "sharding/sharded_parameters.h"

namespace ddp::detail {
namespace {

constexpr std::int64_t kFormat = 1;

}  // namespace

void save_optimizer_state(const torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& parameters,
                          const std::vector<std::string>& names, ShardedParameters* sharded, Communicator& comm,
                          torch::serialize::OutputArchive& archive) {
  c10::NoGradGuard no_grad;
  // Replays of a recorded step count AdamW's steps on the device.
  if (const auto* capturable = dynamic_cast<const optim::CapturableOptimizer*>(&optimizer)) {
    capturable->sync_host_state();
  }
  const OptimizerKind kind = kind_of(optimizer);
  const std::vector<std::string> tensors = state_tensor_names(kind, optimizer);
  const bool writes = comm.rank() == 0;
  auto stepped = [&](std::size_t i) { return stepped_part(parameters, sharded, i); };
  const std::vector<std::int64_t> step = agreed_steps(kind, optimizer, parameters, sharded, comm);

  std::map<std::string, std::vector<at::Tensor>> whole;  // rank 0: per tensor name, per parameter
  for (const std::string& tensor : tensors) {
    std::vector<at::Tensor>& values = whole[tensor];
    values.resize(parameters.size());
    auto keep = [&](std::size_t i, const at::Tensor& value) {
      if (writes && step[i] >= 0) values[i] = value.contiguous().cpu();
    };
    if (sharded) {
      sharded->gather_whole(
          [&](std::size_t i) { return read_param_state(kind, optimizer, stepped(i)).tensors[tensor]; }, keep);
    } else {
      for (std::size_t i = 0; i < parameters.size(); ++i)
        keep(i, read_param_state(kind, optimizer, parameters[i]).tensors[tensor]);
    }
  }
  if (!writes) return;
  archive.write("format", c10::IValue(kFormat));
  archive.write("optimizer", c10::IValue(std::string(name_of(kind))));
  std::int64_t count = 0;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    if (step[i] < 0) continue;  // never stepped: no state, as in one process
    torch::serialize::OutputArchive entry;
    entry.write("name", c10::IValue(names[i]));
    entry.write("step", c10::IValue(step[i]));
    for (const std::string& tensor : tensors) entry.write(tensor, whole[tensor][i]);
    archive.write(fmt::format("p{}", count++), entry);
  }
  archive.write("parameters", c10::IValue(count));
}

void load_optimizer_state(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& parameters,
                          const std::vector<std::string>& names, const ShardedParameters* sharded,
                          torch::serialize::InputArchive& archive) {
  c10::NoGradGuard no_grad;
  const OptimizerKind kind = kind_of(optimizer);
  const std::vector<std::string> tensors = state_tensor_names(kind, optimizer);
  c10::IValue format, saved_kind, count;
  if (!archive.try_read("format", format) || format.toInt() != kFormat || !archive.try_read("optimizer", saved_kind) ||
      !archive.try_read("parameters", count)) {
    throw UsageError("libddp: the checkpoint holds no optimizer state written by save_optimizer_state()");
  }
  if (saved_kind.toStringRef() != name_of(kind)) {
    throw UsageError(fmt::format("libddp: the checkpoint holds the state of the optimizer {}; this one is {}",
                                 saved_kind.toStringRef(), name_of(kind)));
  }
  std::map<std::string, std::size_t> index_of;
  for (std::size_t i = 0; i < names.size(); ++i) index_of[names[i]] = i;
  // A parameter the file has no state for had never stepped when it was
  // saved: it must have none after the load either, whatever it has now.
  std::vector<bool> loaded(parameters.size(), false);
  const std::string source = "the checkpoint's optimizer state";
  for (std::int64_t n = 0; n < count.toInt(); ++n) {
    torch::serialize::InputArchive entry;
    read_entry(archive, fmt::format("p{}", n), entry, source);
    c10::IValue name, step;
    read_entry(entry, "name", name, source);
    read_entry(entry, "step", step, source);
    auto it = index_of.find(name.toStringRef());
    if (it == index_of.end()) {
      throw UsageError(fmt::format("libddp: the checkpoint's optimizer state is for a parameter '{}' that this model "
                                   "does not train; it belongs to another model",
                                   name.toStringRef()));
    }
    loaded[it->second] = true;
    const at::Tensor& parameter = parameters[it->second];
    const at::Tensor target = stepped_part(parameters, sharded, it->second);
    ParamState state{step.toInt(), {}};
    for (const std::string& tensor : tensors) {
      at::Tensor value;
      if (!entry.try_read(tensor, value)) {
        throw UsageError(fmt::format("libddp: the checkpoint's optimizer state of '{}' has no '{}': it was written "
                                     "with other optimizer options",
                                     name.toStringRef(), tensor));
      }
      if (value.sizes() != parameter.sizes()) {
        throw UsageError(fmt::format("libddp: the checkpoint's optimizer state of '{}' has shape [{}], the parameter "
                                     "[{}]; it belongs to another model",
                                     name.toStringRef(), fmt::join(value.sizes(), ", "),
                                     fmt::join(parameter.sizes(), ", ")));
      }
      if (!target.defined()) continue;
      state.tensors[tensor] = sharded ? sharded->part_of(it->second, value)
                                      : at::empty_like(parameter, at::MemoryFormat::Preserve).copy_(value);
    }
    if (target.defined()) write_param_state(kind, optimizer, target, state);
  }
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor target = stepped_part(parameters, sharded, i);
    if (!loaded[i] && target.defined()) erase_param_state(optimizer, target);
  }
}

}  // namespace ddp::detail
