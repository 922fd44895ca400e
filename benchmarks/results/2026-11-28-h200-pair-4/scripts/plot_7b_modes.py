#!/usr/bin/env python3
"""LLaMA-2-7B on two H200s in every sharding mode: peak memory per rank (the state docs/sharding.md's formula
gives, and what lies above it) against an 80 GiB card, with each mode's throughput. Reads the rows of session 22's
call 2 and session 25's call 3; writes llama2-7b-modes.svg beside this folder.

    python3 benchmarks/results/2026-11-28-h200-pair-4/scripts/plot_7b_modes.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.dirname(os.path.dirname(HERE))
SOURCES = ["2026-11-28-h200-pair/call2/rows.jsonl", "2026-11-28-h200-pair-4/call3/rows.jsonl"]
# Bytes per parameter per rank at two ranks (docs/sharding.md), fp32 parameters or bf16 units.
STATE = {("none", "fp32"): 16, ("optimizer", "fp32"): 14, ("gradients", "fp32"): 10, ("full", "fp32"): 8,
         ("optimizer", "bf16"): 12, ("gradients", "bf16"): 10, ("full", "bf16"): 8}
NAMES = {"none": "kNone", "optimizer": "ZeRO-1", "gradients": "ZeRO-2", "full": "ZeRO-3"}
GIB = 2.0 ** 30


def main():
    rows = [json.loads(line) for path in SOURCES for line in open(os.path.join(RESULTS, path)) if line.strip()]
    rows.sort(key=lambda r: -r["peak_mem_gib"])
    left, top, bar_h, gap, scale = 190, 50, 22, 10, 4.2  # pixels per GiB
    width, height = left + int(140 * scale) + 150, top + len(rows) * (bar_h + gap) + 50
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="15" font-weight="bold">LLaMA-2-7B, bf16, '
           f'batch 1 x 4,096, 2 x H200: peak memory per rank by sharding mode</text>',
           f'<text x="{width / 2}" y="37" text-anchor="middle" font-size="11" fill="#555">dark: state (docs/sharding.md),'
           f' light: activations and workspace above it; right: tok/s on the two GPUs</text>']
    for i, r in enumerate(rows):
        y = top + i * (bar_h + gap)
        state = STATE[(r["sharding"], r["param_dtype"])] * r["params"] / GIB
        label = NAMES[r["sharding"]] + (", bf16 units" if r["param_dtype"] == "bf16" else "")
        out.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end" font-size="12">{label}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{state * scale:.1f}" height="{bar_h}" fill="#3b6ea8"/>')
        out.append(f'<rect x="{left + state * scale:.1f}" y="{y}" width="{(r["peak_mem_gib"] - state) * scale:.1f}" '
                   f'height="{bar_h}" fill="#a9c4e4"/>')
        out.append(f'<text x="{left + r["peak_mem_gib"] * scale + 6:.1f}" y="{y + 15}" font-size="11">'
                   f'{r["peak_mem_gib"]:.1f} GiB, {r["throughput"]:,.0f} tok/s</text>')
    bottom = top + len(rows) * (bar_h + gap)
    x80 = left + 80 * scale
    out.append(f'<line x1="{x80}" y1="{top - 6}" x2="{x80}" y2="{bottom}" stroke="#c0392b" stroke-dasharray="5,3"/>')
    out.append(f'<text x="{x80}" y="{bottom + 14}" text-anchor="middle" font-size="11" fill="#c0392b">80 GiB</text>')
    for gib in range(0, 141, 20):
        out.append(f'<text x="{left + gib * scale}" y="{bottom + 30}" text-anchor="middle" font-size="10" '
                   f'fill="#555">{gib}</text>')
    out.append("</svg>")
    with open(os.path.join(os.path.dirname(HERE), "llama2-7b-modes.svg"), "w") as svg:
        svg.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
