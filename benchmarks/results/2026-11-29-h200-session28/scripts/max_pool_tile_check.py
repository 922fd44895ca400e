# Emulates max_pool_backward_tile_kernel's index math (3x3, stride 2, padding 1) on the CPU against ATen.
import torch
torch.manual_seed(0)
for (H, W) in [(112, 112), (15, 17), (9, 9), (2, 3), (1, 1), (4, 5)]:
    C = 3
    x = (torch.relu(torch.randn(1, C, H, W)) * 8).round() / 8
    y, idx = torch.nn.functional.max_pool2d(x, 3, 2, 1, return_indices=True)
    OH, OW = y.shape[2], y.shape[3]
    # offsets as the forward kernel writes them: row-major position in the window
    offs = torch.empty(OH, OW, C, dtype=torch.long)
    for o in range(OH):
        for q in range(OW):
            for c in range(C):
                flat = idx[0, c, o, q].item(); r, cc = divmod(flat, W)
                offs[o, q, c] = (r + 1 - 2 * o) * 3 + (cc + 1 - 2 * q)
    g = torch.randn(1, C, OH, OW)
    xr = x.clone().requires_grad_(); yr = torch.nn.functional.max_pool2d(xr, 3, 2, 1); yr.backward(g)
    ref = xr.grad
    out = torch.full((1, C, H, W), float('nan'))
    for m in range((H + 1) // 2):
        for p in range((W + 1) // 2):
            present = [[m + dr < OH and p + dc < OW for dc in range(2)] for dr in range(2)]
            for pr in range(2):
                row = 2 * m + pr
                if row >= H: continue
                for pc in range(2):
                    col = 2 * p + pc
                    if col >= W: continue
                    for c in range(C):
                        s = 0.0; single = 0.0; windows = 0
                        for dr in range(pr + 1):
                            for dc in range(pc + 1):
                                if not present[dr][dc]: continue
                                windows += 1
                                here = (row + 1 - 2 * (m + dr)) * 3 + col + 1 - 2 * (p + dc)
                                assert 0 <= here < 9
                                if offs[m + dr, p + dc, c] == here:
                                    s += g[0, c, m + dr, p + dc].item(); single = g[0, c, m + dr, p + dc].item()
                        out[0, c, row, col] = single if windows == 1 else s
    assert not torch.isnan(out).any(), (H, W)
    print(H, W, "max diff", (out - ref).abs().max().item())
