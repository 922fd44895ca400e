#pragma once

#include <optional>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <ddp/export.h>

namespace ddp {

/// The math mode of a training step.
enum class Precision {
  kFp32,  ///< fp32 everywhere, TF32 off: the reference.
  kTf32,  ///< fp32 tensors, TF32 tensor cores for cuBLAS matmuls and cuDNN convolutions.
  kBf16,  ///< autocast to bf16; parameters, gradients and optimizer state stay fp32.
  kFp16,  ///< autocast to fp16; needs a GradScaler (loss scaling) to keep small gradients.
  kFp8,   ///< bf16 autocast plus FP8 matmuls in the Float8Linear layers.
};

/// "fp32", "tf32", "bf16", "fp16" or "fp8".
DDP_API std::string to_string(Precision precision);

/// Parses a precision name (any case). UsageError naming the valid choices otherwise.
DDP_API Precision parse_precision(const std::string& name);

/// What a precision means for a training step: the autocast dtype, the TF32
/// switches, whether gradients need loss scaling, and the dtype DDP reduces
/// gradients in.
///
///   auto policy = ddp::PrecisionPolicy::parse("bf16");
///   {
///     ddp::PrecisionGuard guard(policy, device);
///     loss = criterion(model(x), y);
///   }
///   loss.backward();
class DDP_API PrecisionPolicy {
 public:
  /// The policy of `precision`, reducing gradients in fp32.
  /* implicit */ PrecisionPolicy(Precision precision = Precision::kFp32);  // NOLINT
  /// The policy of parse_precision(name).
  static PrecisionPolicy parse(const std::string& name);

  /// The precision this policy implements.
  Precision precision() const { return precision_; }
  /// bf16 for bf16 and fp8, fp16 for fp16; nullopt when forward runs unautocast.
  std::optional<c10::ScalarType> autocast_dtype() const;
  /// TF32 for fp32 matmuls and convolutions: off only for fp32. Under the
  /// autocast policies it applies to the operations autocast leaves in fp32.
  bool allow_tf32() const { return precision_ != Precision::kFp32; }
  /// fp16 only: its narrow exponent range loses small gradients without a GradScaler.
  bool needs_grad_scaler() const { return precision_ == Precision::kFp16; }
  /// fp8 only: Float8Linear layers run their matmuls in FP8.
  bool uses_float8() const { return precision_ == Precision::kFp8; }

  /// The dtype DDP all-reduces gradients in. Default fp32, the parameters'
  /// dtype, as PyTorch DDP under autocast; bf16 or fp16 halve the bytes on the
  /// wire (comm_hooks::average_in) at some cost in accuracy.
  c10::ScalarType gradient_reduce_dtype() const { return gradient_reduce_dtype_; }
  /// Sets the reduction dtype: fp32, bf16 or fp16 (UsageError otherwise).
  PrecisionPolicy& gradient_reduce_dtype(c10::ScalarType dtype);

  /// Throws UsageError when `device` cannot run this policy: fp16 and fp8
  /// need a CUDA device, fp8 an sm_89+ GPU and LibTorch >= 2.4.
  void check_supported(c10::Device device) const;

 private:
  Precision precision_;
  c10::ScalarType gradient_reduce_dtype_ = c10::ScalarType::Float;
};

/// Sets the TF32 switches of `policy` process-wide, for everything that
/// follows, backward included: a PrecisionGuard's switches end with the guard,
/// but backward runs after it. Call it once before training, as a PyTorch
/// script sets torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32.
DDP_API void set_process_tf32(const PrecisionPolicy& policy);

/// The autocast state of one device type: whether autocast is on, and its
/// dtype. Activation checkpointing records it in forward and restores it to
/// recompute that forward in backward (which usually runs outside the
/// autocast region), as torch.utils.checkpoint does. Per thread, as in PyTorch.
struct DDP_API AutocastState {
  bool enabled = false;                                ///< Whether autocast is on.
  c10::ScalarType dtype = c10::ScalarType::Undefined;  ///< The dtype it casts to (kept while off).

  /// The calling thread's state for `device_type`.
  static AutocastState current(c10::DeviceType device_type);
};

/// Sets an autocast state for `device_type` (entering an autocast region when
/// it is on) until the guard is destroyed, then restores the previous one.
class DDP_API AutocastStateGuard {
 public:
  /// Sets `state` for `device_type` until the guard is destroyed.
  AutocastStateGuard(c10::DeviceType device_type, const AutocastState& state);
  ~AutocastStateGuard();
  AutocastStateGuard(const AutocastStateGuard&) = delete;
  AutocastStateGuard& operator=(const AutocastStateGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  AutocastState previous_;
  bool entered_;
};

/// Applies a policy to a region (forward and loss) and restores the previous
/// state when it ends: autocast on `device`'s type with the policy's dtype, and
/// the TF32 switches. Autocast state is per thread; the TF32 switches are
/// process-wide, as in PyTorch. Guards nest.
class DDP_API PrecisionGuard {
 public:
  /// Enters `policy` for `device` until the guard is destroyed.
  PrecisionGuard(const PrecisionPolicy& policy, c10::Device device);
  ~PrecisionGuard();
  PrecisionGuard(const PrecisionGuard&) = delete;
  PrecisionGuard& operator=(const PrecisionGuard&) = delete;

 private:
  bool previous_tf32_cublas_;
  bool previous_tf32_cudnn_;
  AutocastStateGuard autocast_;
};

}  // namespace ddp
