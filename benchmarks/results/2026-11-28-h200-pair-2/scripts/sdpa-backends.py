"""Forward and forward+backward time of causal grouped-query SDPA at TinyLlama-1.1B's shape (batch 4, 32 query
heads, 4 key/value heads, 2048 tokens, head dim 64, bf16), per SDPA backend that accepts it, on one GPU."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, H, HKV, S, D = 4, 32, 4, 2048, 64
dev = "cuda"
q = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(B, HKV, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(B, HKV, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16)
flops_fwd = 4 * B * H * S * S * D / 2  # causal: half the score matrix


def timed(fn, n=30):
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def fwd():
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def fwd_bwd():
    out = fwd()
    out.backward(g)


print("torch", torch.__version__, torch.cuda.get_device_name())
for name, backends in [("default", None), ("cudnn", [SDPBackend.CUDNN_ATTENTION]),
                       ("flash", [SDPBackend.FLASH_ATTENTION]), ("efficient", [SDPBackend.EFFICIENT_ATTENTION])]:
    try:
        if backends is None:
            f, fb = timed(fwd), timed(fwd_bwd)
        else:
            with sdpa_kernel(backends):
                f, fb = timed(fwd), timed(fwd_bwd)
        print(f"{name}: forward {f:.3f} ms ({flops_fwd / f / 1e9:.0f} TFLOP/s), backward {fb - f:.3f} ms "
              f"({2.5 * flops_fwd / (fb - f) / 1e9:.0f} TFLOP/s), both {fb:.3f} ms; x22 layers {22 * fb:.1f} ms")
    except Exception as e:  # a backend that refuses the shape
        print(f"{name}: refused: {str(e).splitlines()[0][:200]}")
