"""PyTorch DDP reference for the scaling benchmark: the models, training steps
and timing of benchmarks/scaling/scaling_bench.cpp, in stock PyTorch, so that
libddp can be compared with what a Python user runs.

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/scaling/pytorch_ddp.py --model llama --preset tinyllama-1.1b --precision bf16 --json out.jsonl

Models (each the op-for-op equivalent of the C++ one as --unfused builds it;
libddp's default fusions, listed in README.md, differ only in how they compute):
  resnet50  examples/resnet50/resnet.cpp: torchvision's ResNet-50 (v1.5),
            channels_last, SGD (momentum 0.9, weight decay 5e-5 on weights of
            dim > 1 only, no nesterov; fused on CUDA, as libddp's FusedSGD),
            cross entropy with label smoothing 0.1 (train_resnet50.cpp).
  llama     examples/llama/llama_model.cpp: RMSNorm and interleaved RoPE in
            fp32, grouped-query attention by repeat_interleave, causal SDPA,
            SwiGLU, bias-free linear layers, untied output head. AdamW
            (lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on weights
            of dim >= 2 only; fused on CUDA), cross entropy on logits cast to
            fp32 (train_llama.cpp / llama_training.cpp).

Precision (libddp's PrecisionPolicy): fp32 = TF32 off; tf32 = TF32 on for
cuBLAS and cuDNN, no autocast; bf16 = TF32 on plus bf16 autocast around
forward and loss; fp8 (llama only) = bf16 plus torchao's tensorwise FP8 in
every linear layer but the output head, as libddp's enable_float8_training.
The TF32 switches are set for the whole process, so backward and the
optimizer run under them too.

Timing, the same method as the C++ side:
  - one synthetic batch per rank, made once on the device and reused;
  - --warmup W untimed steps, then device synchronize and a barrier;
  - --steps K timed steps, then device synchronize and a barrier again;
    wall clock (perf_counter) between the two barriers, so the slowest rank's:
    step_ms = wall / K, throughput = items per step over all ranks / (wall / K),
    items = images or tokens;
  - per step, CUDA events on the current stream at: step start, after
    forward + loss, after backward, after optimizer.step() +
    zero_grad(set_to_none=True); read after the final synchronize and
    averaged over the K steps -> forward_ms, backward_ms, optimizer_ms.
    backward_ms includes the gradient all-reduce left exposed at its end
    (DDP makes the current stream wait for it inside backward), as the C++
    side's does; how much of it was communication cannot be seen from
    outside PyTorch DDP, so exposed_comm_ms is null here. On the CPU,
    perf_counter replaces the events (CPU ops are synchronous);
  - all times are measured on rank 0; peak_mem_gib is torch.cuda.max_memory_allocated()
    over the whole run (warm-up included), the largest over ranks;
  - final_loss is the last step's loss averaged over ranks.

Rank 0 appends one JSON object, one line, to --json; a configuration that
cannot run here (fp8 without torchao, say) gives an object with
"unavailable": "<reason>" instead of the measurements, and exit status 0.
"""

import argparse
import importlib
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

RESNET50_PARAMETERS = 25_557_032

# vocab_size, dim, n_layers, n_heads, n_kv_heads, ffn_hidden, max_seq_len: LlamaConfig::preset.
# torch.compile's mode -> the implementation the result row names (run_scaling.py's --impls).
COMPILE_IMPLS = {"default": "pytorch-compile", "reduce-overhead": "pytorch-compile-graphs"}

LLAMA_PRESETS = {
    "tiny": (256, 64, 2, 4, 2, 176, 64),
    "tinyllama-1.1b": (32000, 2048, 22, 32, 4, 5632, 2048),
    "llama2-7b": (32000, 4096, 32, 32, 32, 11008, 4096),
}


class Unavailable(Exception):
    """This configuration cannot run here; the message says why."""


# --------------------------------------------------------------------------- ResNet-50


def conv(in_channels, out_channels, kernel, stride):
    return nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=kernel // 2, bias=False)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels, width, stride):
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = conv(in_channels, width, 1, 1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv(width, width, 3, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv(width, out_channels, 1, 1)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(conv(in_channels, out_channels, 1, stride), nn.BatchNorm2d(out_channels))

    def forward(self, x):
        # Out-of-place ReLUs and the shortcut first, as the C++ block runs them
        # (torchvision's in-place ReLUs would save activation memory libddp does not).
        identity = self.downsample(x) if self.downsample is not None else x
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, blocks, num_classes):
        super().__init__()
        self.conv1 = conv(3, 64, 7, 2)
        self.bn1 = nn.BatchNorm2d(64)
        in_channels = 64
        stages = []
        for width, count, stride in zip((64, 128, 256, 512), blocks, (1, 2, 2, 2)):
            layer = []
            for i in range(count):
                layer.append(Bottleneck(in_channels, width, stride if i == 0 else 1))
                in_channels = width * Bottleneck.expansion
            stages.append(nn.Sequential(*layer))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(in_channels, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, 3, 2, 1)
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = layer(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def resnet50(num_classes=1000):
    return ResNet((3, 4, 6, 3), num_classes)


# --------------------------------------------------------------------------- LLaMA


class LlamaConfig:
    def __init__(self, preset):
        (self.vocab_size, self.dim, self.n_layers, self.n_heads, self.n_kv_heads, self.ffn_hidden,
         self.max_seq_len) = LLAMA_PRESETS[preset]
        self.rope_theta = 10000.0
        self.norm_eps = 1e-5
        self.head_dim = self.dim // self.n_heads

    def parameter_count(self):
        """LlamaConfig::parameter_count(), untied embeddings."""
        kv_dim = self.n_kv_heads * self.head_dim
        attention = 2 * self.dim * self.dim + 2 * self.dim * kv_dim
        feed_forward = 3 * self.dim * self.ffn_hidden
        block = attention + feed_forward + 2 * self.dim
        return 2 * self.vocab_size * self.dim + self.n_layers * block + self.dim


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


def rotate(x, cos, sin):
    """Rotation::apply: rotates consecutive feature pairs of x [batch, seq, heads, head_dim] in fp32."""
    seq = x.size(1)
    pairs = x.float().reshape(x.size(0), seq, x.size(2), -1, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    c = cos.view(1, seq, 1, -1)
    s = sin.view(1, seq, 1, -1)
    return torch.stack((even * c - odd * s, even * s + odd * c), -1).flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.wq = nn.Linear(config.dim, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, config.dim, bias=False)

    def forward(self, x, cos, sin):
        batch, seq, _ = x.shape
        q = rotate(self.wq(x).view(batch, seq, self.n_heads, self.head_dim), cos, sin).transpose(1, 2)
        k = rotate(self.wk(x).view(batch, seq, self.n_kv_heads, self.head_dim), cos, sin).transpose(1, 2)
        v = self.wv(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.n_kv_heads != self.n_heads:
            group = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, self.n_heads * self.head_dim))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config.dim, config.ffn_hidden)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        # The rotary tables are plain attributes, not buffers, as in the C++
        # model: DDP would otherwise broadcast them before every forward.
        inverse_frequencies = 1.0 / config.rope_theta ** (
            torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim)
        angles = torch.outer(torch.arange(config.max_seq_len, dtype=torch.float64), inverse_frequencies)
        self.cos, self.sin = angles.cos().float(), angles.sin().float()

        std = 0.02
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, 0.0, std)
            nn.init.normal_(self.tok_embeddings.weight, 0.0, std)
            residual_std = std / math.sqrt(2.0 * config.n_layers)
            for block in self.layers:
                nn.init.normal_(block.attention.wo.weight, 0.0, residual_std)
                nn.init.normal_(block.feed_forward.w2.weight, 0.0, residual_std)

    def forward(self, tokens):
        seq = tokens.size(1)
        if self.cos.device != tokens.device:
            self.cos, self.sin = self.cos.to(tokens.device), self.sin.to(tokens.device)
        cos, sin = self.cos[:seq], self.sin[:seq]
        h = self.tok_embeddings(tokens)
        for block in self.layers:
            h = block(h, cos, sin)
        return self.output(self.norm(h))


def llama_flops_per_token(config, params, seq):
    """Matmul FLOPs of forward and backward per token: 6 per weight outside the
    embedding lookup, plus causal attention (QK^T and AV, half the square)."""
    return 6 * (params - config.vocab_size * config.dim) + 6 * config.n_layers * seq * config.dim


# --------------------------------------------------------------------------- benchmark


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("resnet50", "llama"), required=True)
    parser.add_argument("--preset", default="tinyllama-1.1b", help="LLaMA preset: " + ", ".join(LLAMA_PRESETS))
    parser.add_argument("--precision", choices=("fp32", "tf32", "bf16", "fp8"), default="bf16")
    parser.add_argument("--batch", type=int, help="images or sequences per rank (default: 128 for resnet50, 4 for llama)")
    parser.add_argument("--seq", type=int, help="tokens per sequence (llama; default: the preset's max_seq_len)")
    parser.add_argument("--image-size", type=int, default=224, help="side of the square images (resnet50)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    parser.add_argument("--json", required=True, help="JSON-lines file rank 0 appends the result to")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--reduce-dtype", choices=("fp32", "bf16"), default="fp32",
                        help="dtype the gradients are all-reduced in; bf16 registers PyTorch's bf16_compress_hook "
                        "(only where there is more than one process), as scaling_bench --reduce-dtype")
    parser.add_argument("--compile", nargs="?", const="default", choices=COMPILE_IMPLS,
                        help="torch.compile the DDP-wrapped model in this mode (default: the default mode; "
                        "reduce-overhead adds CUDA graphs). DDP's optimizer splits the graph at bucket boundaries so "
                        "that the all-reduces still overlap backward; compilation happens in the first warm-up step, "
                        "which is timed apart (compile_s)")
    parser.add_argument("--sync-bn", action="store_true",
                        help="resnet50: BatchNorm statistics over every rank's batch (torch.nn.SyncBatchNorm, CUDA "
                        "only), as scaling_bench --sync-bn")
    parser.add_argument("--profile-trace", help="after the timed steps, profile one more and write its Chrome trace here "
                        "(rank 0), as scaling_bench --profile-trace")
    args = parser.parse_args()
    if args.batch is None:
        args.batch = 128 if args.model == "resnet50" else 4
    if args.model == "resnet50":
        args.preset, args.seq = None, None
    else:
        args.image_size = None
        if args.preset not in LLAMA_PRESETS:
            parser.error(f"unknown LLaMA preset '{args.preset}' (valid: {', '.join(LLAMA_PRESETS)})")
        max_seq_len = LlamaConfig(args.preset).max_seq_len
        if args.seq is None:
            args.seq = max_seq_len
        if not 1 <= args.seq <= max_seq_len:
            parser.error(f"--seq must be in [1, {max_seq_len}] for preset {args.preset}")
    if args.batch < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--batch and --steps must be at least 1, --warmup not negative")
    if args.compile == "reduce-overhead" and args.device != "cuda":
        parser.error("--compile reduce-overhead records CUDA graphs: it needs --device cuda")
    if args.compile and args.warmup < 1:
        parser.error("--compile needs --warmup of at least 1: the first step compiles and is not timed")
    if args.sync_bn and args.model != "resnet50":
        parser.error("--sync-bn is resnet50's: llama has no BatchNorm")
    if args.image_size is not None and args.image_size < 32:
        parser.error("--image-size must be at least 32")
    return args


def check_available(args, device):
    """Raises Unavailable where libddp's check_supported would refuse, or stock PyTorch has no path."""
    if args.sync_bn and device.type != "cuda":
        raise Unavailable("torch.nn.SyncBatchNorm runs on CUDA only")
    if args.precision != "fp8":
        return
    if args.model == "resnet50":
        raise Unavailable("fp8 speeds up linear layers only; ResNet-50's work is in its convolutions")
    if device.type != "cuda":
        raise Unavailable("fp8 needs a CUDA GPU")
    if torch.cuda.get_device_capability(device) < (8, 9):
        raise Unavailable(f"fp8 needs compute capability 8.9+, {torch.cuda.get_device_name(device)} has "
                          f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}")
    try:
        importlib.import_module("torchao.float8")
    except ImportError as error:
        raise Unavailable(f"stock PyTorch trains in FP8 through torchao, which does not import here ({error})")


def set_math_mode(precision, device):
    # libddp's PrecisionPolicy: TF32 on under every policy but fp32.
    tf32 = precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    # As train_resnet50: let cuDNN pick the fastest convolution algorithms.
    torch.backends.cudnn.benchmark = True
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision in ("bf16", "fp8"))


def build_resnet(args, device, generator):
    model = resnet50()
    if args.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device, memory_format=torch.channels_last)
    params = sum(p.numel() for p in model.parameters())
    assert params == RESNET50_PARAMETERS, f"ResNet-50 has {params} parameters, expected {RESNET50_PARAMETERS}"
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": 5e-5}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=0.1, momentum=0.9, fused=device.type == "cuda")
    shape = (args.batch, 3, args.image_size, args.image_size)
    images = torch.randn(shape, device=device, generator=generator).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (args.batch,), device=device, generator=generator)

    def loss_fn(ddp_model):
        return F.cross_entropy(ddp_model(images), labels, label_smoothing=0.1)

    return model, optimizer, loss_fn, params, None


def build_llama(args, device, generator):
    config = LlamaConfig(args.preset)
    model = Llama(config).to(device)
    params = sum(p.numel() for p in model.parameters())
    assert params == config.parameter_count(), f"LLaMA has {params} parameters, closed form {config.parameter_count()}"
    if args.precision == "fp8":
        from torchao.float8 import convert_to_float8_training

        # As llama::enable_float8_training: the output head stays in bf16, its logits feed the softmax.
        convert_to_float8_training(model, module_filter_fn=lambda module, fqn: fqn != "output")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1), device=device, generator=generator)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def loss_fn(ddp_model):
        logits = ddp_model(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))

    return model, optimizer, loss_fn, params, llama_flops_per_token(config, params, args.seq)


class PhaseClock:
    """Marks the phase boundaries of every timed step: CUDA events on the
    current stream, or host time on the CPU, where ops are synchronous."""

    def __init__(self, device, steps, marks_per_step=4):
        self.cuda = device.type == "cuda"
        self.marks = [[None] * marks_per_step for _ in range(steps)]
        if self.cuda:
            self.marks = [[torch.cuda.Event(enable_timing=True) for _ in range(marks_per_step)] for _ in range(steps)]

    def mark(self, step, index):
        if self.cuda:
            self.marks[step][index].record()
        else:
            self.marks[step][index] = time.perf_counter()

    def mean_ms(self, begin, end):
        """Mean over the steps of the time between two marks; call after synchronizing."""
        if self.cuda:
            total = sum(marks[begin].elapsed_time(marks[end]) for marks in self.marks)
        else:
            total = 1e3 * sum(marks[end] - marks[begin] for marks in self.marks)
        return total / len(self.marks)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args, rank, world_size, device):
    check_available(args, device)
    autocast = set_math_mode(args.precision, device)
    torch.manual_seed(0)  # the same initial model everywhere; DDP broadcasts rank 0's anyway
    generator = torch.Generator(device=device).manual_seed(1000 + rank)  # a different batch on every rank
    build = build_resnet if args.model == "resnet50" else build_llama
    model, optimizer, loss_fn, params, flops_per_item = build(args, device, generator)
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                    gradient_as_bucket_view=True, bucket_cap_mb=25)
    if args.reduce_dtype == "bf16" and world_size > 1:
        ddp_model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    if args.compile:
        ddp_model = torch.compile(ddp_model, mode=args.compile)

    def step(clock=None, index=0):
        if args.compile == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs may be overwritten
        if clock:
            clock.mark(index, 0)
        with autocast:
            loss = loss_fn(ddp_model)
        if clock:
            clock.mark(index, 1)
        loss.backward()
        if clock:
            clock.mark(index, 2)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if clock:
            clock.mark(index, 3)
        return loss.detach()

    # The first step compiles (with --compile): timed on its own, then the
    # other warm-up steps let the compiled graphs settle.
    synchronize(device)
    first_start, first_step_s = time.perf_counter(), None
    for index in range(args.warmup):
        step()
        if index == 0:
            synchronize(device)
            first_step_s = time.perf_counter() - first_start
    clock = PhaseClock(device, args.steps)
    synchronize(device)
    dist.barrier()
    start = time.perf_counter()
    for index in range(args.steps):
        loss = step(clock, index)
    synchronize(device)
    dist.barrier()
    seconds = time.perf_counter() - start

    if args.profile_trace:
        # Every rank runs the step (DDP's collectives need all of them); rank 0 records it.
        def profiled_step():
            step()
            synchronize(device)
            dist.barrier()

        if rank == 0:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=activities) as profile:
                profiled_step()
            profile.export_chrome_trace(args.profile_trace)
        else:
            profiled_step()

    # gloo has no AVG: sum, then divide.
    loss = loss.float().reshape(1)
    dist.all_reduce(loss)
    peak_gib = None
    if device.type == "cuda":
        peak = torch.tensor([torch.cuda.max_memory_allocated(device) / 2**30], device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        peak_gib = peak.item()

    items_per_step = args.batch * (args.seq if args.model == "llama" else 1) * world_size
    step_ms = 1e3 * seconds / args.steps
    throughput = items_per_step / (seconds / args.steps)
    return {
        "step_ms": step_ms,
        "throughput": throughput,
        "forward_ms": clock.mean_ms(0, 1),
        "backward_ms": clock.mean_ms(1, 2),
        "optimizer_ms": clock.mean_ms(2, 3),
        "exposed_comm_ms": None,
        "peak_mem_gib": peak_gib,
        "params": params,
        "flops_per_item": flops_per_item,
        "tflops_per_gpu": throughput * flops_per_item / world_size / 1e12 if flops_per_item else None,
        "final_loss": loss.item() / world_size,
        "compile_s": first_step_s if args.compile else None,
    }


def main():
    args = parse_args()
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("pytorch_ddp.py: no CUDA device; use --device cpu")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size,
                            **({"device_id": device} if device.type == "cuda" else {}))

    row = {
        "impl": COMPILE_IMPLS[args.compile] if args.compile else "pytorch",
        "model": args.model,
        "preset": args.preset,
        "precision": args.precision,
        "gpus": world_size,
        "batch_per_gpu": args.batch,
        "seq": args.seq,
        "image_size": args.image_size,
        "steps": args.steps,
        "warmup": args.warmup,
        "reduce_dtype": args.reduce_dtype,
        "sync_bn": args.sync_bn,
        "nccl_env": {name: value for name, value in sorted(os.environ.items()) if name.startswith("NCCL_")},
        "unit": "img/s" if args.model == "resnet50" else "tok/s",
        "torch_version": torch.__version__,
    }
    try:
        row.update(run(args, rank, world_size, device))
    except Unavailable as reason:
        row["unavailable"] = str(reason)
    if rank == 0:
        with open(args.json, "a") as out:
            out.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
