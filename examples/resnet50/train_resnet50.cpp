// ResNet-50 on ImageNet-shaped data with libddp: one process per GPU, started
// by ddprun. The same program trains on one GPU, many GPUs, or CPU processes.
//
//   ddprun --nproc-per-node gpu build/examples/resnet50/train_resnet50 --precision bf16
//   ddprun --nproc-per-node gpu build/examples/resnet50/train_resnet50 --data /data/imagenet-shards --steps 50000
//
// SGD with momentum and weight decay (none on BatchNorm and biases), linear
// warmup then cosine, label smoothing, channels_last. Data: synthetic batches
// by default, or the shards convert_imagefolder writes (docs/data_formats.md).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "images.h"
#include "fatal_error.h"
#include "flags.h"
#include "resnet.h"
#include "resnet_training.h"
#include "trainer.h"

namespace {

/// Top-1 and top-5 accuracy over `batches` batches of `source`, summed over ranks.
std::pair<std::string, std::string> evaluate(ddp::DistributedDataParallel<resnet::ResNet>& model,
                                             data::ImageSource& source, std::int64_t batches,
                                             const ddp::PrecisionPolicy& policy, ddp::ProcessGroup& process_group) {
  torch::NoGradGuard no_grad;
  model.module()->eval();
  const auto device = process_group.device();
  at::Tensor counts = torch::zeros({3}, torch::TensorOptions().device(device).dtype(torch::kDouble));  // n, top1, top5
  for (std::int64_t i = 0; i < batches; ++i) {
    const data::ImageBatch batch = source.next();
    at::Tensor logits;
    {
      ddp::PrecisionGuard guard(policy, device);
      logits = model.module()->forward(batch.images);
    }
    // With fewer than 5 classes every label is among the top 5.
    const at::Tensor top5 = std::get<1>(logits.topk(std::min<std::int64_t>(5, logits.size(1)), 1));
    const at::Tensor hits = top5.eq(batch.labels.unsqueeze(1));
    counts[0] += batch.labels.size(0);
    counts[1] += hits.select(1, 0).sum();
    counts[2] += hits.any(1).sum();
  }
  process_group.communicator().all_reduce(counts, ddp::ReduceOp::kSum)->wait();
  model.module()->train();
  const auto host = counts.cpu();
  const double n = std::max(1.0, host[0].item<double>());
  const double top1 = host[1].item<double>() / n, top5 = host[2].item<double>() / n;
  return {fmt::format("validation top-1 {:.2f}%, top-5 {:.2f}% ({} images)", 100 * top1, 100 * top5, n),
          fmt::format("\"top1\": {:.5f}, \"top5\": {:.5f}, \"images\": {}", top1, top5, n)};
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Flags flags("train_resnet50", "Trains torchvision's ResNet-50 with libddp DistributedDataParallel.");
  flags.add("precision", "bf16", "fp32 | tf32 | bf16 | fp16")
      .add("batch", "128", "images per micro-batch and rank")
      .add("data", "synthetic", "'synthetic', or a directory of image shards (train/ and val/ splits)")
      .add("image-size", "224", "side of the (cropped) images")
      .add("classes", "1000", "classes of the synthetic data (real data: from its class list)")
      .add("workers", "6", "loader threads per rank (real data)")
      .add("eval-batches", "20", "validation batches per rank at each evaluation")
      .add("momentum", "0.9", "SGD momentum")
      .add("weight-decay", "5e-5", "SGD weight decay (not on BatchNorm or biases)")
      .add("label-smoothing", "0.1", "label smoothing of the cross entropy")
      .add("seed", "0", "random seed (model, data order, augmentation)")
      .add("bn", "auto", resnet::kBatchNormPathHelp)
      .add_switch("sync-bn",
                  "BatchNorm statistics over every rank's batch (ddp::SyncBatchNorm), for small per-GPU batches")
      .add_switch("deterministic",
                  "the same losses run after run on a GPU: cuDNN's deterministic algorithms, not autotuned (slower); "
                  "what makes a resumed run checkable against an uninterrupted one");
  // lr 0.1 per 256 images is Goyal et al.'s rule; the default here assumes 2 x 128.
  // The captured step by default: ResNet-50's eager step launches ~1,500
  // kernels, and a replay takes a tenth of a millisecond to launch them all.
  examples::add_trainer_flags(flags, /*default_lr=*/0.1, /*default_steps=*/200, /*default_warmup=*/20,
                              /*default_cuda_graph=*/"auto");
  flags.parse(argc, argv);

  const auto policy = ddp::PrecisionPolicy::parse(flags.str("precision"));
  resnet::check_precision(policy);
  const ddp::FusedBatchNormPath batch_norm_path = resnet::parse_batch_norm_path(flags.str("bn"));
  flags.real_in("weight-decay", 0, HUGE_VAL, /*high_open=*/true);
  flags.real_in("momentum", 0, 1, /*high_open=*/true);
  flags.real_in("label-smoothing", 0, 1, /*high_open=*/false);
  if (flags.integer("eval-batches") < 0) flags.fail("--eval-batches must be at least 0 (0: no evaluation)");
  auto process_group = ddp::init();
  examples::require_same_flags_on_every_rank(flags, *process_group);
  const auto device = process_group->device();
  policy.check_supported(device);
  const std::int64_t batch = flags.integer("batch");
  const std::int64_t image_size = flags.integer("image-size");
  if (batch < 1 || image_size < 32) flags.fail("--batch must be >= 1 and --image-size >= 32");
  // Autotuning picks the fastest convolution algorithms, some of which sum
  // with atomics in an order that changes from run to run.
  const bool deterministic = flags.on("deterministic");
  at::globalContext().setBenchmarkCuDNN(!deterministic);
  at::globalContext().setDeterministicCuDNN(deterministic);

  auto options = examples::trainer_options(flags);
  // Data first: a real dataset fixes the number of classes.
  data::ImageLoaderOptions loader;
  loader.batch_size = batch;
  loader.rank = process_group->rank();
  loader.world_size = process_group->world_size();
  loader.seed = static_cast<std::uint64_t>(flags.integer("seed"));
  loader.crop_size = image_size;
  loader.workers = flags.integer("workers");
  loader.device = device;
  loader.batches_per_step = options.grad_accum;
  std::unique_ptr<data::ImageSource> train_data, val_data;
  std::int64_t classes = flags.integer("classes");
  if (flags.str("data") == "synthetic") {
    train_data = std::make_unique<data::SyntheticImages>(loader, classes);
    auto val = loader;
    val.seed += 1;
    val.train = false;
    val_data = std::make_unique<data::SyntheticImages>(val, classes);
  } else {
    auto train_set = std::make_shared<const data::ImageShardDataset>(flags.str("data"), "train");
    auto val_set = std::make_shared<const data::ImageShardDataset>(flags.str("data"), "val");
    classes = static_cast<std::int64_t>(train_set->class_names().size());
    auto train = loader;
    train.uneven_tail = options.uneven_join;
    train_data = std::make_unique<data::ImageLoader>(train_set, train);
    auto val = loader;
    val.train = false;
    val_data = std::make_unique<data::ImageLoader>(val_set, val);
  }

  torch::manual_seed(flags.integer("seed"));
  const bool sync_bn = flags.on("sync-bn");
  auto model = resnet::resnet50(classes, sync_bn ? process_group : nullptr);
  model->set_batch_norm_path(batch_norm_path);
  model->to(device);
  resnet::to_channels_last(*model);
  ddp::DistributedDataParallel<resnet::ResNet> ddp_model(model, process_group);

  const auto optimizer =
      resnet::make_sgd(ddp_model, flags.real("lr"), flags.real("momentum"), flags.real("weight-decay"));

  options.unit = "img/s";
  options.items_per_micro_batch = static_cast<double>(batch);
  options.fingerprint = fmt::format(
      "resnet50 classes={} image={} batch={}x{} ranks={} precision={} data={} seed={} sync_bn={} {} momentum={} "
      "weight_decay={} label_smoothing={}",
      classes, image_size, batch, options.grad_accum, process_group->world_size(), ddp::to_string(policy.precision()),
      flags.str("data"), flags.integer("seed"), sync_bn, options.fingerprint, flags.real("momentum"),
      flags.real("weight-decay"), flags.real("label-smoothing"));
  if (process_group->rank() == 0) {
    std::printf("ResNet-50 (%lld classes) on %d x %s, %s, batch %lld x %lld per rank%s\n",
                static_cast<long long>(classes), process_group->world_size(), device.str().c_str(),
                ddp::to_string(policy.precision()).c_str(), static_cast<long long>(batch),
                static_cast<long long>(options.grad_accum), sync_bn ? ", SyncBatchNorm" : "");
  }

  const auto criterion = torch::nn::CrossEntropyLossOptions().label_smoothing(flags.real("label-smoothing"));
  examples::TrainingCallbacks callbacks;
  callbacks.next_batch = [&] {
    const data::ImageBatch batch_data = train_data->next();
    return std::vector<at::Tensor>{batch_data.images, batch_data.labels};
  };
  callbacks.micro_step = [&](const std::vector<at::Tensor>& batch, bool sync, ddp::GradScaler& scaler,
                             double loss_weight) {
    std::optional<ddp::DistributedDataParallel<resnet::ResNet>::NoSyncGuard> no_sync;
    if (!sync) no_sync.emplace(ddp_model.no_sync());
    at::Tensor loss;
    {
      ddp::PrecisionGuard guard(policy, device);
      loss = torch::nn::functional::cross_entropy(
          ddp_model(batch[0]), batch[1],
          torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(criterion.label_smoothing()));
    }
    scaler.scale(loss * loss_weight).backward();
    return loss.detach();
  };
  callbacks.clip_grad_norm = [&](double max_norm) { ddp::clip_grad_norm_(ddp_model, max_norm); };
  callbacks.model_checkpointing = examples::model_checkpointing(ddp_model, *optimizer);
  if (options.uneven_join) examples::train_uneven_tails_under_join(callbacks, *train_data, ddp_model);
  callbacks.data_position = [&] {
    const auto position = train_data->position();
    return std::vector<std::int64_t>{position.epoch, position.batch};
  };
  callbacks.seek_data = [&](const std::vector<std::int64_t>& position) {
    train_data->seek(data::ImagePosition{position.at(0), position.at(1)});
  };
  const std::int64_t eval_batches = flags.integer("eval-batches");
  if (eval_batches > 0) {
    callbacks.evaluate = [&] {
      val_data->seek({});
      return evaluate(ddp_model, *val_data, eval_batches, policy, *process_group);
    };
  }
  examples::Trainer trainer(process_group, policy, *optimizer, options);
  trainer.run(callbacks);
  return 0;
} catch (const std::exception& e) {
  return examples::report_fatal_error("train_resnet50", e);
}
