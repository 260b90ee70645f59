#!/usr/bin/python3
"""vitlens against PyTorch on the same attention shapes, in the same run.

For each image size S of the default model shape (P = 4, D = 48, H = 4, d = 12; N = (S/4)^2 + 1
tokens with the class token), one after the other so both see the same machine state:
  vitlens      `vitlens_bench --json --size S` in a fresh process: medians of the full forward
               (LayerNorm, qkv, every head's attention with attention received and the class
               row, proj, MLP) and of the attention alone
  torch MHA    nn.MultiheadAttention(48, 4, batch_first=True) on a (1, N, 48) input (input
               projection, attention, output projection) with need_weights=False, and with
               need_weights=True, average_attn_weights=False (per-head weights, as vitlens keeps)
  torch plain  softmax(Q K^T / sqrt(d)) V on (1, 4, N, 12) tensors
and prints the medians and the ratios PyTorch / vitlens: MHA against vitlens' full forward (which
does strictly more work), plain against vitlens' attention alone. PyTorch is skipped at a size
where its (H, N, N) tensors would not fit in the available memory.

Usage: /usr/bin/python3 bench/compare_pytorch.py [--bench PATH] [--size S ...] [--threads T]
                                                 [--runs R] [--json]
"""
import argparse
import json
import os
import subprocess
import sys

import torch

from bench_common import median_ms

DIM, HEADS, PATCH = 48, 4, 4
HEAD_DIM = DIM // HEADS




def available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


def time_vitlens(bench, size, threads, runs):
    out = subprocess.run([bench, "--json", "--size", str(size), "--threads", str(threads), "--runs", str(runs),
                          "--no-export", "--reference-max-tokens", "0"],
                         check=True, capture_output=True, text=True)
    result = json.loads(out.stdout)["sizes"][0]
    if "error" in result:
        raise RuntimeError(f"vitlens_bench at {size} px: {result['error']}")
    return result


def time_torch(tokens, runs, budget_s):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(DIM, HEADS, batch_first=True).eval()
    x = torch.randn(1, tokens, DIM)
    q, k, v = (torch.randn(1, HEADS, tokens, HEAD_DIM) for _ in range(3))
    scale = HEAD_DIM ** -0.5
    with torch.inference_mode():
        # One untimed call of each first: PyTorch allocates and picks its kernels on first use.
        steps = {
            "mha_ms": lambda: mha(x, x, x, need_weights=False),
            "mha_weights_ms": lambda: mha(x, x, x, need_weights=True, average_attn_weights=False),
            "plain_ms": lambda: torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v,
        }
        times = {}
        for name, step in steps.items():
            step()
            times[name] = median_ms(step, runs, budget_s)[0]
    return times


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", default=os.path.join(here, "..", "build", "bench", "vitlens_bench"),
                        help="the vitlens_bench executable (default: build/bench/vitlens_bench)")
    parser.add_argument("--size", type=int, action="append", help="image sizes in pixels (default 64 128 224 448 1024)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both (default: all cores)")
    parser.add_argument("--runs", type=int, default=9, help="most runs per median")
    parser.add_argument("--budget", type=float, default=20.0, help="seconds after which a median stops adding runs")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args()
    sizes = args.size or [64, 128, 224, 448, 1024]
    if not os.access(args.bench, os.X_OK):
        sys.exit(f"compare_pytorch.py: no vitlens_bench at {args.bench} (build it, or pass --bench)")
    torch.set_num_threads(args.threads)

    rows = []
    for size in sizes:
        tokens = (size // PATCH) ** 2 + 1
        row = {"image": size, "tokens": tokens}
        vit = time_vitlens(args.bench, size, args.threads, args.runs)
        row["vitlens_forward_ms"] = vit["forward_ms"]["median"]
        row["vitlens_attention_ms"] = vit["attention_ms"]["median"]
        row["vitlens_peak_rss_mib"] = vit["peak_rss_mib"]
        # MHA with weights holds about three (1, H, N, N) float tensors at once.
        one_tensor = 4 * HEADS * tokens * tokens
        if 3 * one_tensor > 0.6 * available_bytes():
            row["torch_skipped"] = f"one (H, N, N) float tensor is {one_tensor / 2**30:.0f} GiB"
        else:
            row.update(time_torch(tokens, args.runs, args.budget))
            row["ratio_mha"] = row["mha_ms"] / row["vitlens_forward_ms"]
            row["ratio_mha_weights"] = row["mha_weights_ms"] / row["vitlens_forward_ms"]
            row["ratio_plain"] = row["plain_ms"] / row["vitlens_attention_ms"]
        rows.append(row)
        print(f"compare_pytorch.py: {size} px done", file=sys.stderr)

    report = {"torch": torch.__version__, "threads": args.threads, "sizes": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"vitlens vs PyTorch {torch.__version__}, {args.threads} threads each; medians in ms; "
          "ratio = PyTorch / vitlens (MHA vs vitlens' full forward, plain vs vitlens' attention)\n")
    header = ("image", "tokens", "vitlens fwd", "vitlens attn", "MHA", "ratio", "MHA+weights", "ratio",
              "plain", "ratio")
    print("%6s %7s %12s %13s %9s %7s %12s %7s %9s %7s" % header)
    for r in rows:
        if "torch_skipped" in r:
            print("%6d %7d %12.3g %13.3g   PyTorch skipped: %s" % (r["image"], r["tokens"], r["vitlens_forward_ms"],
                                                                   r["vitlens_attention_ms"], r["torch_skipped"]))
            continue
        print("%6d %7d %12.3g %13.3g %9.4g %6.1fx %12.4g %6.1fx %9.4g %6.1fx" % (
            r["image"], r["tokens"], r["vitlens_forward_ms"], r["vitlens_attention_ms"], r["mha_ms"], r["ratio_mha"],
            r["mha_weights_ms"], r["ratio_mha_weights"], r["plain_ms"], r["ratio_plain"]))


if __name__ == "__main__":
    main()
