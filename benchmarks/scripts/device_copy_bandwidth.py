"""The device's copy bandwidth now, the yardstick a kernel's bandwidth is read against in the same lease: a 256 MiB
device-to-device copy, the mean of 20 copies after 3 warm-up copies, bytes read and written per second.
Importable (device_copy_tbps) or run: prints the figure."""
import torch


def device_copy_tbps(byte_count=1 << 28):
    x = torch.empty(byte_count, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    return 2 * byte_count / (start.elapsed_time(end) / 20) / 1e9


if __name__ == "__main__":
    print(f"device copy of 256 MiB: {device_copy_tbps():.2f} TB/s (read + write)")
