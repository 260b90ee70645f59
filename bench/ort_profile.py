#!/work/venv/bin/python
"""Where ONNX Runtime's forward time goes, by operator, beside vitlens' forward on the same weights.

compare_peers.py compares whole forwards; this splits ONNX Runtime's (the `onnx` peer: the same
random timm model, exported the same way) by operator type with ONNX Runtime's own profiler
(SessionOptions.enable_profiling), and gives its Gemm nodes' rate in GFLOP/s (2 M N K a node), so a
gap between vitlens and ONNX Runtime can be placed: the Linear layers, the attention, or the rest.
With --bench, vitlens_bench runs on the same weights in the same rounds (forward, and the
attention of one layer times the depth).

Each of R rounds (--rounds) runs ONNX Runtime (3 untimed runs, then --runs profiled ones) in a
child process, then vitlens_bench (its medians); ONNX Runtime's times are means over the profiled
forwards, and the table shows their medians over the rounds. Profiling adds a little time to each
node; the profiled forward is printed beside the operators' sum.

Usage: /work/venv/bin/python bench/ort_profile.py [--bench build/bench/vitlens_bench]
           [--arch card|vit_s16|vit_b16|vit_s8] [--size S] [--threads T] [--runs N] [--rounds R]
"""
import argparse
import collections
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_peers  # noqa: E402 (the model, its export, the ONNX Runtime session, the environment line)


def profile_child(model_path, size, threads, runs, prefix):
    """In this process: ONNX Runtime on model_path, profiled; prints one JSON line."""
    import numpy
    session = compare_peers.onnx_session(model_path, threads, profile_prefix=prefix)
    feed = {"image": numpy.random.default_rng(0).standard_normal((1, 3, size, size), dtype=numpy.float32)}
    for _ in range(3):
        session.run(None, feed)
    # The warm-up runs are profiled too: only the last `runs` model_run events and their nodes count.
    for _ in range(runs):
        session.run(None, feed)
    with open(session.end_profiling()) as f:
        events = json.load(f)
    model_runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[-runs:]
    start = model_runs[0]["ts"]
    per_op = collections.defaultdict(float)
    gemm_flops = 0.0
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or e["ts"] < start:
            continue
        op = e["args"]["op_name"]
        per_op[op] += e["dur"] / 1e3 / runs
        if op == "Gemm":  # A (M, K) (or (..., K)), Y (M, N)
            a, y = e["args"]["input_type_shape"][0]["float"], e["args"]["output_type_shape"][0]["float"]
            gemm_flops += 2.0 * numpy.prod(a) * y[-1] / runs
    forward = statistics.fmean(e["dur"] / 1e3 for e in model_runs)  # a mean, as the operators' times
    print(json.dumps({"forward_ms": forward, "per_op_ms": per_op, "gemm_flops": float(gemm_flops)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", help="vitlens_bench, to run on the same weights in the same rounds")
    parser.add_argument("--arch", choices=sorted(compare_peers.ARCHS), default="vit_s16")
    parser.add_argument("--size", type=int, default=224, help="image size in pixels (default 224)")
    parser.add_argument("--threads", type=int, default=1, help="threads of each (default 1)")
    parser.add_argument("--runs", type=int, default=20,
                        help="profiled forwards a round, and vitlens_bench's runs (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, ONNX Runtime then vitlens (default 3)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("size", "threads", "runs", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.size % compare_peers.ARCHS[args.arch][2]:
        parser.error(f"--size must be a multiple of {args.arch}'s patch, {compare_peers.ARCHS[args.arch][2]} px")
    if args.child:
        profile_child(args.child[0], args.size, args.threads, args.runs, args.child[1])
        return
    if args.bench and not (os.path.isfile(args.bench) and os.access(args.bench, os.X_OK)):
        parser.error(f"--bench {args.bench}: not an executable file")
    compare_peers.set_arch(args.arch)
    env = compare_peers.environment(args.threads)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="vitlens-ort-profile-") as tmp:
        model = compare_peers.make_timm(args.size)
        onnx_path, vitlens_path = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "model.safetensors")
        compare_peers.export_onnx(model, args.size, onnx_path, with_maps=False)
        compare_peers.write_vitlens_model(model, args.size, vitlens_path)
        for r in range(args.rounds):
            child = subprocess.run([sys.executable, os.path.abspath(__file__), "--arch", args.arch, "--size",
                                    str(args.size), "--threads", str(args.threads), "--runs", str(args.runs),
                                    "--child", onnx_path, os.path.join(tmp, f"profile{r}")],
                                   capture_output=True, text=True)
            lines = child.stdout.strip().splitlines()
            if child.returncode != 0 or not lines:
                why = (child.stderr.strip().splitlines() or [f"exit status {child.returncode}, no output"])[-1]
                sys.exit(f"ort_profile.py: ONNX Runtime's run failed: {why}")
            result = {"onnx": json.loads(lines[-1])}
            if args.bench:
                out = subprocess.run([args.bench, "--json", "--model", vitlens_path, "--size", str(args.size),
                                      "--threads", str(args.threads), "--runs", str(args.runs), "--min-runs",
                                      str(args.runs), "--no-export", "--no-limits", "--reference-max-tokens", "0"],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    sys.exit(f"ort_profile.py: vitlens_bench failed: {out.stderr.strip()}")
                size = json.loads(out.stdout)["sizes"][0]
                result["vitlens"] = {"forward_ms": size["forward_ms"]["median"],
                                     "attention_ms": size["attention_ms"]["median"] * compare_peers.DEPTH}
            rounds.append(result)
            print(f"ort_profile.py: round {r + 1} of {args.rounds} done", file=sys.stderr)

    print(f"# ONNX Runtime by operator, {args.arch} at {args.size} px, {env['date']}, {env['cpu']} "
          f"({env['cores']} cores; {' '.join(env['cpu_flags'])}), {args.threads} threads, load average "
          f"{env['load_average_before']}")
    print(f"# onnxruntime {env['onnxruntime']}, torch {env['torch']}, timm {env['timm']}; medians over {args.rounds} "
          f"rounds of {args.runs} profiled forwards")
    print("\n| ONNX Runtime (means per forward) | ms a forward | share |\n|---|---:|---:|")
    ops = sorted({op for r in rounds for op in r["onnx"]["per_op_ms"]},
                 key=lambda op: -statistics.median(r["onnx"]["per_op_ms"].get(op, 0.0) for r in rounds))
    total = statistics.median(sum(r["onnx"]["per_op_ms"].values()) for r in rounds)
    for op in ops:
        ms = statistics.median(r["onnx"]["per_op_ms"].get(op, 0.0) for r in rounds)
        if ms >= 0.005 * total:
            print(f"| {op} | {ms:.2f} | {100 * ms / total:.1f} % |")
    print(f"| all operators | {total:.2f} | |")
    print(f"| ONNX Runtime forward (profiled; its operators and the time between them) | "
          f"{statistics.median(r['onnx']['forward_ms'] for r in rounds):.2f} | |")
    if all("Gemm" in r["onnx"]["per_op_ms"] for r in rounds):
        rate = statistics.median(r["onnx"]["gemm_flops"] / r["onnx"]["per_op_ms"]["Gemm"] / 1e6 for r in rounds)
        print(f"\nONNX Runtime's Gemm nodes (the Linear layers): {rate:.1f} GFLOP/s")
    if args.bench:
        forward = statistics.median(r["vitlens"]["forward_ms"] for r in rounds)
        attention = statistics.median(r["vitlens"]["attention_ms"] for r in rounds)
        print("forward in each round, ONNX Runtime (profiled) / vitlens: " +
              ", ".join(f"{r['onnx']['forward_ms']:.1f} / {r['vitlens']['forward_ms']:.1f} ms" for r in rounds))
        print(f"vitlens (same rounds, vitlens_bench's medians): forward {forward:.2f} ms, attention of one layer x "
              f"{compare_peers.DEPTH} layers {attention:.2f} ms, the rest (Linear layers with fc1's GELU, LayerNorm, "
              f"residual adds, patches) {forward - attention:.2f} ms")


if __name__ == "__main__":
    main()
