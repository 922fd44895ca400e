"""ResNet-50's stem convolution (7x7, stride 2, 64 filters, batch 128, 224 px, channels_last) with its 3 input
channels zero-padded to 4 or 8: forward and weight gradient (the stem needs no input gradient) timed in a CUDA
graph, cuDNN benchmark mode on. MLPerf's ResNet-50 pads the images to 4 channels; this says whether cuDNN has a
faster kernel for the padded shape here."""
import sys
import torch

torch.backends.cudnn.benchmark = True
dtype = {"bf16": torch.bfloat16, "tf32": torch.float32}[sys.argv[1]]
torch.backends.cudnn.allow_tf32 = True
torch.backends.cuda.matmul.allow_tf32 = True
for channels in (3, 4, 8):
    x = torch.randn(128, channels, 224, 224, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
    w = torch.randn(64, channels, 7, 7, device="cuda", dtype=dtype, requires_grad=True)
    w.data = w.data.contiguous(memory_format=torch.channels_last)
    g = torch.randn(128, 64, 112, 112, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)

    def step():
        y = torch.nn.functional.conv2d(x, w, stride=2, padding=3)
        (wg,) = torch.autograd.grad(y, w, g)
        return wg

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 20)
    times.sort()
    print(f"{sys.argv[1]} channels {channels}: forward + weight gradient {times[2]:.3f} ms (median of 5 x 20 replays)")
