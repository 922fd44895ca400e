// A LLaMA-architecture decoder trained with libddp: one process per GPU,
// started by ddprun. Presets from a CPU-sized `tiny` to TinyLlama-1.1B and
// LLaMA-2-7B; every dimension can be overridden.
//
//   ddprun --nproc-per-node gpu build/examples/llama/train_llama --preset tinyllama-1.1b --precision bf16
//   build/examples/make_tokens --input book.txt --output book.bin
//   ddprun --nproc-per-node gpu build/examples/llama/train_llama --preset tiny --data book.bin
//
// AdamW (fused on GPUs) without decay on norms, warmup then cosine, gradient
// clipping, gradient accumulation with no_sync, optional activation
// checkpointing; fp8 runs the decoder's linear layers in FP8.

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "fatal_error.h"
#include "flags.h"
#include "llama_model.h"
#include "llama_training.h"
#include "tokens.h"
#include "trainer.h"

namespace {

using DataParallelLlama = ddp::DistributedDataParallel<llama::Llama>;

// Evaluation runs through DDP too: it brings sharded parameters up to date
// after the optimizer's step, and under kFull gathers each block as it runs.
// `tokens`: [B, T + 1] on the device; the inputs are the first T of each
// row, the targets the last T.
at::Tensor next_token_loss(DataParallelLlama& model, const at::Tensor& tokens, const c10::Device& device,
                           const ddp::PrecisionPolicy& policy) {
  const std::int64_t length = tokens.size(1) - 1;
  ddp::PrecisionGuard guard(policy, device);
  const at::Tensor logits = model(tokens.narrow(1, 0, length));
  return llama::next_token_loss(logits, tokens.narrow(1, 1, length), model.module()->config.fused_kernels);
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Flags flags("train_llama", "Trains a LLaMA-architecture decoder with libddp DistributedDataParallel.");
  flags.add("preset", "tiny", "tiny | tinyllama-1.1b | llama2-7b")
      .add("dim", "", "model width (default: the preset's)")
      .add("layers", "", "decoder blocks")
      .add("heads", "", "attention heads")
      .add("kv-heads", "", "key/value heads (grouped-query attention)")
      .add("ffn", "", "hidden size of the SwiGLU feed-forward")
      .add("vocab", "", "vocabulary size")
      .add("seq-len", "", "tokens per sequence")
      .add("precision", "bf16", "fp32 | tf32 | bf16 | fp16 | fp8")
      .add("fp8-scaling", "delayed", "fp8 recipe: delayed (amax history, Transformer Engine's default) | current")
      .add_switch("fp8-fast-accum",
                  "fp8: cuBLAS fast accumulation in the forward matmuls, as Transformer Engine's and "
                  "torchao's recipes do (off: every product accumulated in fp32)")
      .add("batch", "4", "sequences per micro-batch and rank")
      .add("data", "synthetic", "'synthetic', or a token file (make_tokens; llm.c or nanoGPT layout)")
      .add("val-data", "", "token file for validation (default: the training data, in file order)")
      .add("eval-batches", "10", "validation batches per rank at each evaluation")
      .add_switch("unfused",
                  "the ATen ops of PyTorch's reference model instead of the fused kernels and GEMM epilogues "
                  "(to compare the loss curves); its q, k, v are three layers (wq, wk, wv) where the default has "
                  "one (wqkv), so a checkpoint resumes only with the flag it was written with")
      .add_switch("activation-checkpointing", "recompute each block's activations in backward to save memory")
      .add("sharding", "none",
           "what each rank keeps whole: none (plain DDP) | optimizer (ZeRO-1: optimizer state sharded) | gradients "
           "(ZeRO-2: gradients too) | full (ZeRO-3: parameters too, each block gathered only while it runs)")
      .add("param-dtype", "fp32",
           "a sharded mode: the dtype blocks are gathered and computed in, fp32 | bf16 (FSDP's param_dtype, "
           "DeepSpeed's bf16 mode: half the gather and reduction traffic, no autocast copies of the weights; the "
           "optimizer keeps fp32 masters)")
      .add("weight-decay", "0.1", "AdamW weight decay (not on norms)")
      .add("beta2", "0.95", "AdamW beta2")
      .add("seed", "0", "random seed");
  // Eager by default: LLaMA's step is long enough that its launches hide
  // behind the kernels (captured: +0.5%), and --sharding full across ranks
  // cannot be recorded.
  examples::add_trainer_flags(flags, /*default_lr=*/3e-4, /*default_steps=*/200, /*default_warmup=*/20,
                              /*default_cuda_graph=*/"off");
  flags.parse(argc, argv);

  llama::LlamaConfig config;
  try {
    config = llama::LlamaConfig::preset(flags.str("preset"));
  } catch (const std::invalid_argument& e) {
    flags.fail(e.what());
  }
  const auto override_dimension = [&](const char* flag, std::int64_t& field) {
    if (!flags.given(flag)) return;
    field = flags.integer(flag);
    if (field < 1) flags.fail(fmt::format("--{} must be positive", flag));
  };
  override_dimension("dim", config.dim);
  override_dimension("layers", config.n_layers);
  override_dimension("heads", config.n_heads);
  override_dimension("kv-heads", config.n_kv_heads);
  override_dimension("ffn", config.ffn_hidden);
  override_dimension("vocab", config.vocab_size);
  override_dimension("seq-len", config.max_seq_len);
  if (config.dim % config.n_heads != 0 || config.n_heads % config.n_kv_heads != 0) {
    flags.fail(fmt::format("--dim ({}) must be a multiple of --heads ({}), and --heads of --kv-heads ({})", config.dim,
                           config.n_heads, config.n_kv_heads));
  }
  config.activation_checkpointing = flags.on("activation-checkpointing");
  if (flags.on("unfused")) llama::use_reference_ops(config);
  const std::int64_t batch = flags.integer("batch");
  if (batch < 1) flags.fail("--batch must be at least 1");

  const auto policy = ddp::PrecisionPolicy::parse(flags.str("precision"));
  ddp::DistributedDataParallelOptions ddp_options;
  try {
    ddp_options = llama::sharding_options(flags.str("sharding"), flags.str("param-dtype"), policy);
  } catch (const std::invalid_argument& e) {
    flags.fail(e.what());
  }
  const ddp::Sharding sharding = ddp_options.sharding();
  ddp::Float8Scaling float8_scaling{};
  try {
    float8_scaling = llama::float8_scaling_named(flags.str("fp8-scaling"));
  } catch (const std::invalid_argument& e) {
    flags.fail(e.what());
  }
  auto options = examples::trainer_options(flags);
  flags.real_in("weight-decay", 0, HUGE_VAL, /*high_open=*/true);
  flags.real_in("beta2", 0, 1, /*high_open=*/true);
  if (flags.integer("eval-batches") < 0) flags.fail("--eval-batches must be at least 0 (0: no evaluation)");
  if (options.uneven_join && policy.uses_float8() && float8_scaling == ddp::Float8Scaling::kDelayed) {
    flags.fail(
        "--uneven join: FP8 delayed scaling all-reduces its amaxes outside DDP, which ddp::Join does not "
        "meet; use --fp8-scaling current or --uneven drop");
  }
  auto process_group = ddp::init();
  examples::require_same_flags_on_every_rank(flags, *process_group);
  const auto device = process_group->device();
  policy.check_supported(device);

  data::TokenBatchOptions token_options;
  token_options.batch_size = batch;
  token_options.seq_len = config.max_seq_len;
  token_options.rank = process_group->rank();
  token_options.world_size = process_group->world_size();
  token_options.seed = static_cast<std::uint64_t>(flags.integer("seed"));
  token_options.vocab_size = config.vocab_size;
  token_options.batches_per_step = options.grad_accum;
  std::unique_ptr<data::TokenSource> train_data, val_data;
  if (flags.str("data") == "synthetic") {
    train_data = std::make_unique<data::SyntheticTokens>(token_options);
    auto val = token_options;
    val.seed += 1;
    val_data = std::make_unique<data::SyntheticTokens>(val);
  } else {
    auto train = token_options;
    train.uneven_tail = options.uneven_join;
    train_data = std::make_unique<data::TokenBatches>(flags.str("data"), train);
    auto val = token_options;
    val.shuffle = false;
    val_data = std::make_unique<data::TokenBatches>(
        flags.str("val-data").empty() ? flags.str("data") : flags.str("val-data"), val);
  }

  torch::manual_seed(flags.integer("seed"));
  llama::Llama model(config);
  model->to(device);
  if (policy.uses_float8()) {
    const auto report = llama::enable_float8_training(*model, float8_scaling, flags.on("fp8-fast-accum"));
    if (process_group->rank() == 0) {
      std::printf("fp8: %zu linear layers in FP8, %zu left in bf16\n", report.converted.size(),
                  report.skipped.size());
    }
  }
  DataParallelLlama ddp_model(model, process_group, ddp_options);

  const auto optimizer =
      llama::make_adamw(ddp_model, flags.real("lr"), flags.real("beta2"), flags.real("weight-decay"));

  options.unit = "tok/s";
  options.items_per_micro_batch = static_cast<double>(batch * config.max_seq_len);
  options.fingerprint = fmt::format(
      "llama dim={} layers={} heads={}/{} ffn={} vocab={} seq={} batch={}x{} ranks={} precision={} "
      "data={} seed={} uneven={} {} beta2={} weight_decay={}",
      config.dim, config.n_layers, config.n_heads, config.n_kv_heads, config.ffn_hidden, config.vocab_size,
      config.max_seq_len, batch, options.grad_accum, process_group->world_size(), ddp::to_string(policy.precision()),
      flags.str("data"), flags.integer("seed"), flags.str("uneven"), options.fingerprint, flags.real("beta2"),
      flags.real("weight-decay"));
  if (process_group->rank() == 0) {
    std::printf("LLaMA %s: %.3f B parameters, %lld layers, dim %lld; %d x %s, %s, %lld x %lld sequences of %lld "
                "tokens per rank; optimizer %s\n",
                flags.str("preset").c_str(), static_cast<double>(config.parameter_count()) / 1e9,
                static_cast<long long>(config.n_layers), static_cast<long long>(config.dim),
                process_group->world_size(), device.str().c_str(), ddp::to_string(policy.precision()).c_str(),
                static_cast<long long>(batch), static_cast<long long>(options.grad_accum),
                static_cast<long long>(config.max_seq_len), optimizer->fused() ? "fused AdamW" : "AdamW");
    std::printf("%s\n", ddp_model.memory_report(optimizer.get()).to_string().c_str());
    std::printf("uniform-guess loss: ln(%lld) = %.3f\n", static_cast<long long>(config.vocab_size),
                std::log(static_cast<double>(config.vocab_size)));
  }

  const bool agree_on_float8_scales = policy.uses_float8() && float8_scaling == ddp::Float8Scaling::kDelayed;
  examples::TrainingCallbacks callbacks;
  callbacks.next_batch = [&] {
    return std::vector<at::Tensor>{train_data->next().tokens.to(device, /*non_blocking=*/true)};
  };
  callbacks.micro_step = [&](const std::vector<at::Tensor>& batch, bool sync, ddp::GradScaler& scaler,
                             double loss_weight) {
    std::optional<DataParallelLlama::NoSyncGuard> no_sync;
    if (!sync) no_sync.emplace(ddp_model.no_sync());
    const at::Tensor loss = next_token_loss(ddp_model, batch[0], device, policy);
    scaler.scale(loss * loss_weight).backward();
    // Delayed scaling: every rank then casts with the same scales, and rank
    // 0's checkpoint holds every rank's FP8 state, so --resume is exact.
    if (agree_on_float8_scales) ddp::float8::all_reduce_amaxes(*model, *process_group);
    return loss.detach();
  };
  callbacks.clip_grad_norm = [&](double max_norm) { ddp::clip_grad_norm_(ddp_model, max_norm); };
  callbacks.model_checkpointing = examples::model_checkpointing(ddp_model, *optimizer);
  if (options.uneven_join) examples::train_uneven_tails_under_join(callbacks, *train_data, ddp_model);
  callbacks.data_position = [&] { return std::vector<std::int64_t>{train_data->position()}; };
  callbacks.seek_data = [&](const std::vector<std::int64_t>& position) { train_data->seek(position.at(0)); };
  const std::int64_t eval_batches = flags.integer("eval-batches");
  if (eval_batches > 0) {
    callbacks.evaluate = [&]() -> std::pair<std::string, std::string> {
      torch::NoGradGuard no_grad;
      val_data->seek(0);
      at::Tensor total = torch::zeros({1}, torch::TensorOptions().device(device));
      for (std::int64_t i = 0; i < eval_batches; ++i) {
        total += next_token_loss(ddp_model, val_data->next().tokens.to(device, /*non_blocking=*/true), device, policy);
      }
      process_group->communicator().all_reduce(total, ddp::ReduceOp::kAvg)->wait();
      const double loss = total.item<double>() / static_cast<double>(eval_batches);
      return {fmt::format("validation loss {:.4f} (perplexity {:.2f})", loss, std::exp(loss)),
              fmt::format("\"val_loss\": {:.6f}", loss)};
    };
  }
  examples::Trainer trainer(process_group, policy, *optimizer, options);
  trainer.run(callbacks);
  return 0;
} catch (const std::exception& e) {
  return examples::report_fatal_error("train_llama", e);
}
