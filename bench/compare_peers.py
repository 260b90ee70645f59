#!/work/venv/bin/python
"""vitlens against the peers a user would pick instead, same weights, same machine, same run.

For each image size S of the card's model shape (P = 4, D = 48, 4 heads of 12, one block, class
token; N = (S/4)^2 + 1 tokens), one peer after the other, each in its own process (so its peak
memory is its own; the Python peers' peak includes the interpreter and torch, about 300 MB):
  vitlens             `vitlens_bench --json --model M --size S`: the full forward with everything the
                      viewer needs (every head's attention received and class row), and attention alone
  mha / mha_weights   PyTorch 2 nn.MultiheadAttention(48, 4) on (1, N, 48), need_weights False / True
                      (per-head weights, average_attn_weights=False)
  sdpa                F.scaled_dot_product_attention on (1, 4, N, 12)
  timm / timm_maps    timm VisionTransformer.forward_features with the same weights as vitlens, plain
                      (fused attention) and with every layer's (H, N, N) attention maps returned
  onnx / onnx_maps    ONNX Runtime (default CPU provider) on the same two models exported with
                      torch.onnx.export
  timm_bf16           (bfloat16 peers) timm's forward_features with the model and the image in
                      bfloat16 (model.to(torch.bfloat16): PyTorch 2 with bfloat16 weights)
  timm_autocast       (bfloat16 peers) timm's float32 model under torch.autocast("cpu", dtype=torch.bfloat16)
  torch113_mha[_weights], torch113_plain
                      Debian's python3-torch 1.13 (/usr/bin/python3) with libblas.so.3 = OpenBLAS
                      (`apt-get install python3-torch libopenblas0-pthread`), MHA and softmax(QK^T)V;
                      OpenBLAS's own threads set to 1 and to the thread count, the faster kept
                      (its default, one per core, used both cores in a 1-thread run)
M is the timm model's random weights written as a vitlens safetensors file (timm tensor names,
config in __metadata__), so vitlens, timm and ONNX Runtime compute the same function.

`--arch vit_s16` runs ViT-S/16's shape instead (D 384, 6 heads of 64, 12 blocks; use --size 224),
`--arch vit_b16` ViT-B/16's (D 768, 12 heads of 64, 12 blocks; --size 224) and `--arch vit_s8`
ViT-S/8's (D 384, 6 heads of 64, patch 8, 12 blocks; --size 480 gives its 3601 tokens).

`--precision` picks the arithmetic compared: fp32 (default) runs `vitlens_bench --precision fp32`
against the float32 peers above; bf16 runs `vitlens_bench --precision bf16` (bfloat16 Linear layers
and attention products, vit.hpp Precision) against the bfloat16 peers; both runs vitlens in both
precisions and every peer, each peer's ratio against vitlens in its own precision, plus vitlens'
own float32 forward over its bf16 one.

Every table and JSON names the machine (the CPU's model name as lscpu prints it, its ISA flags),
the cores and threads, the date and every peer's version. `--save` also writes the table to
bench/results/<date>-peers-<arch>-<precision>-<threads>t.md (never over an existing file).

Usage: /work/venv/bin/python bench/compare_peers.py --bench build/bench/vitlens_bench
           [--arch card|vit_s16|vit_b16|vit_s8] [--size S ...] [--threads T] [--runs R] [--budget SECONDS]
           [--rounds R] [--json] [--skip PEER ...] [--precision fp32|bf16|both] [--save]
Ratios are peer / vitlens (above 1: vitlens is faster): full-model peers against vitlens' forward,
attention-only peers (sdpa, *_plain) against vitlens' attention alone. With --rounds R (default 1)
vitlens and the peers run in turn R times: a shared VM's speed drifts by tens of percent within
minutes, so each ratio is the median of the R rounds' ratios, shown with their range.
"""
import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile

import bench_common

# --arch: the card's block (default) or a timm shape: ViT-S/16 (vit_small_patch16_224: D 384, 6 heads
# of 64, 12 blocks, MLP 1536), ViT-B/16 (vit_base_patch16_224: D 768, 12 heads of 64, MLP 3072), ViT-S/8
# (dino_vits8's: ViT-S with 8 px patches), all with random weights: (D, heads, patch, depth).
# set_arch() sets these for the run and its children.
ARCHS = {"card": (48, 4, 4, 1), "vit_s16": (384, 6, 16, 12), "vit_b16": (768, 12, 16, 12), "vit_s8": (384, 6, 8, 12)}
DIM, HEADS, PATCH, DEPTH = ARCHS["card"]
HEAD_DIM = DIM // HEADS


def set_arch(name):
    global DIM, HEADS, PATCH, DEPTH, HEAD_DIM
    DIM, HEADS, PATCH, DEPTH = ARCHS[name]
    HEAD_DIM = DIM // HEADS
HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEM_PYTHON = "/usr/bin/python3"
MODEL_PEERS = ["timm", "timm_maps", "onnx", "onnx_maps"]
ATTENTION_PEERS = ["sdpa", "torch113_plain"]
TORCH2_PEERS = ["mha", "mha_weights", "sdpa"] + MODEL_PEERS
TORCH113_PEERS = ["torch113_mha", "torch113_mha_weights", "torch113_plain"]
BF16_PEERS = ["timm_bf16", "timm_autocast"]  # with --precision bf16 or both
# The peer whose ratio is vitlens' own float32 forward over its bf16 one (--precision both).
OWN_FP32 = "vitlens_fp32_over_bf16"


def median_ms(step, runs, budget_s):
    """(median ms, runs) of step() (bench_common.median_ms) after one untimed run: allocation and
    kernel choice on first use."""
    step()
    return bench_common.median_ms(step, runs, budget_s)


# ---------------------------------------------------------------------------------------------
# The model (PyTorch 2 + timm), its vitlens file and its ONNX exports


def make_timm(size, seed=0):
    import timm  # noqa: F401 (the venv's)
    import torch
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(seed)
    model = VisionTransformer(img_size=size, patch_size=PATCH, embed_dim=DIM, depth=DEPTH, num_heads=HEADS,
                              mlp_ratio=4.0, qkv_bias=True, class_token=True, num_classes=0, global_pool="token")
    # timm's init leaves small weights; scale them so the attention is not uniform (timing does not care;
    # the deeper model gets smaller ones so that 12 blocks stay finite).
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3 if DEPTH == 1 else 0.05)
        for blk in model.blocks:
            blk.norm1.weight.fill_(1.0), blk.norm2.weight.fill_(1.0)
        model.norm.weight.fill_(1.0)
    return model.eval()


def forward_with_maps(model, x):
    """timm's forward_features step by step, with each block's attention softmax(q k^T * scale) kept."""
    import torch
    x = model.patch_embed(x)
    x = model._pos_embed(x)
    x = model.norm_pre(x)
    maps = []
    for blk in model.blocks:
        attn = blk.attn
        y = blk.norm1(x)
        b, n, c = y.shape
        qkv = attn.qkv(y).reshape(b, n, 3, attn.num_heads, c // attn.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = attn.q_norm(q), attn.k_norm(k)
        weights = torch.softmax((q * attn.scale) @ k.transpose(-2, -1), dim=-1)
        maps.append(weights)
        y = (weights @ v).transpose(1, 2).reshape(b, n, c)
        x = x + blk.drop_path1(blk.ls1(attn.proj(y)))
        x = x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x))))
    return model.norm(x), maps


def write_vitlens_model(model, size, path):
    from safetensors.torch import save_file
    config = {"name": f"peers-{size}", "description": "random weights, bench/compare_peers.py",
              "patch_size": PATCH, "embed_dim": DIM, "num_heads": HEADS, "depth": DEPTH, "img_size": [size, size],
              "class_token": True, "mlp_ratio": 4.0, "norm_eps": 1e-6, "mean": [0.5, 0.5, 0.5],
              "std": [0.5, 0.5, 0.5], "qkv_bias": True}
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, path, metadata={"config": json.dumps(config), "format": "pt"})


def export_onnx(model, size, path, with_maps):
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            if with_maps:
                out, maps = forward_with_maps(self.inner, x)
                return (out, *maps)
            return self.inner.forward_features(x)

    x = torch.randn(1, 3, size, size)
    kwargs = dict(opset_version=17, input_names=["image"])
    try:
        torch.onnx.export(Wrapped(model), (x,), path, dynamo=False, **kwargs)
    except TypeError:  # an exporter without the dynamo switch
        torch.onnx.export(Wrapped(model), (x,), path, **kwargs)


def onnx_session(path, threads, profile_prefix=None):
    """ONNX Runtime's default CPU provider on `threads` threads (one inter-op thread), as the onnx
    peers run it; with profile_prefix, its profiler on (bench/ort_profile.py)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------------------------------------
# One peer in this process (the child): prints {"ms", "runs", "peak_rss_mib"}


def run_peer(peer, size, threads, runs, budget, model_dir):
    import torch
    torch.set_num_threads(threads)
    tokens = (size // PATCH) ** 2 + 1
    torch.manual_seed(0)
    x_tokens = torch.randn(1, tokens, DIM)
    q, k, v = (torch.randn(1, HEADS, tokens, HEAD_DIM) for _ in range(3))
    scale = HEAD_DIM ** -0.5
    image = torch.randn(1, 3, size, size)
    with torch.inference_mode():
        if peer in ("mha", "mha_weights", "torch113_mha", "torch113_mha_weights"):
            mha = torch.nn.MultiheadAttention(DIM, HEADS, batch_first=True).eval()
            weights = peer.endswith("weights")
            step = lambda: mha(x_tokens, x_tokens, x_tokens, need_weights=weights, average_attn_weights=False)
        elif peer == "sdpa":
            step = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)
        elif peer == "torch113_plain":
            step = lambda: torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v
        elif peer == "timm_bf16":
            model = make_timm(size).to(torch.bfloat16)
            image_bf16 = image.to(torch.bfloat16)
            step = lambda: model.forward_features(image_bf16)
        elif peer == "timm_autocast":
            model = make_timm(size)

            def step():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return model.forward_features(image)
        elif peer in ("timm", "timm_maps"):
            model = make_timm(size)
            if peer == "timm":
                step = lambda: model.forward_features(image)
            else:
                step = lambda: forward_with_maps(model, image)
        elif peer in ("onnx", "onnx_maps"):
            session = onnx_session(os.path.join(model_dir, f"{peer}.onnx"), threads)
            feed = {"image": image.numpy()}
            step = lambda: session.run(None, feed)
        else:
            raise SystemExit(f"compare_peers.py: unknown peer {peer}")
        result = {}
        if peer.startswith("torch113"):
            # Debian's OpenBLAS starts one thread per core of its own beside PyTorch's: a 1-thread
            # peer would use both cores, and on all of them the two pools spin against each other
            # (bench/train_pytorch.py). So at most `threads` of them, and the faster of 1 and `threads`.
            from train_pytorch import set_openblas_threads  # this folder
            best = None
            for blas_threads in sorted({1, threads}):
                if not set_openblas_threads(blas_threads):
                    break  # no OpenBLAS in this process: nothing to set
                ms, n = median_ms(step, runs, budget)
                if best is None or ms < best[0]:
                    best = (ms, n, blas_threads)
            if best:
                ms, n, result["openblas_threads"] = best
        if "openblas_threads" not in result:
            ms, n = median_ms(step, runs, budget)
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork and execve, so a child would report
    # the parent's peak (the parent holds torch, timm and the ONNX exports: about 1.1 GB).
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024.0
    print(json.dumps({"ms": ms, "runs": n, "peak_rss_mib": peak, **result}))


def peer_in_child(python, peer, size, args, model_dir):
    cmd = [python, os.path.abspath(__file__), "--peer", peer, "--arch", args.arch, "--size", str(size),
           "--threads", str(args.threads),
           "--runs", str(args.runs), "--budget", str(args.budget), "--model-dir", model_dir]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def peer_precision(peer):
    """The vitlens precision a peer's ratio is taken against."""
    return "bf16" if peer in BF16_PEERS or peer == OWN_FP32 else "fp32"


def summarise_rounds(rounds, order, precisions):
    """The row of one size from --rounds rounds of ({precision: vitlens' bench JSON}, {peer: result}):
    vitlens' medians over rounds in each precision, and each peer's ratio as the median of its
    per-round ratios against vitlens in the peer's precision (rounds where both ran), with their
    range. Rounds where vitlens failed keep their peers' times and list the errors."""
    row = {"rounds": len(rounds), "vitlens": {}}
    for precision in precisions:
        good = [v[precision] for v, _ in rounds if "error" not in v[precision]]
        if not good:
            row["vitlens"][precision] = {"error": rounds[0][0][precision]["error"]}
            continue
        entry = {"forward_ms": statistics.median(v["forward_ms"]["median"] for v in good),
                 "attention_ms": statistics.median(v["attention_ms"]["median"] for v in good),
                 "peak_rss_mib": max(v["peak_rss_mib"] for v in good)}
        if len(good) < len(rounds):
            entry["errors"] = [v[precision]["error"] for v, _ in rounds if "error" in v[precision]]
        row["vitlens"][precision] = entry
    peers = {}
    for peer in order:
        ran = [p[peer] for _, p in rounds if "ms" in p[peer]]
        if not ran:
            peers[peer] = rounds[0][1][peer]
            continue
        entry = {"ms": statistics.median(r["ms"] for r in ran), "rounds": len(ran),
                 "peak_rss_mib": max(r["peak_rss_mib"] for r in ran), "against": "vitlens " + peer_precision(peer)}
        blas = sorted({r["openblas_threads"] for r in ran if "openblas_threads" in r})
        if blas:
            entry["openblas_threads"] = blas  # the faster setting of each round
        key = "attention_ms" if peer in ATTENTION_PEERS else "forward_ms"
        own = peer_precision(peer)
        ratios = [p[peer]["ms"] / v[own][key]["median"] for v, p in rounds if "ms" in p[peer] and "error" not in v[own]]
        if ratios:
            entry.update(ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios))
        peers[peer] = entry
    row["peers"] = peers
    return row


def fits(size, factor):
    tokens = (size // PATCH) ** 2 + 1
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    return factor * 4 * HEADS * tokens * tokens < 0.6 * avail


# ---------------------------------------------------------------------------------------------
# The run


def cpu_model_name():
    """lscpu's "Model name", or /proc/cpuinfo's "model name" where lscpu is missing."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "")
        if name:
            return name
    except OSError:
        pass
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown CPU")


def environment(threads):
    import numpy
    import onnxruntime
    import timm
    import torch
    flags = []
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = sorted(w for w in line.split(":")[1].split() if w.startswith(("avx", "fma", "sse4", "amx")))
                break
    cpu = cpu_model_name()
    old = subprocess.run([SYSTEM_PYTHON, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                         text=True)
    blas = subprocess.run(["readlink", "-f", "/usr/lib/x86_64-linux-gnu/libblas.so.3"], capture_output=True,
                          text=True).stdout.strip()
    with open("/proc/loadavg") as f:
        load = float(f.read().split()[0])
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cpu": cpu,
            "cpu_flags": flags, "cores": os.cpu_count(), "threads": threads, "load_average_before": load,
            "python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
            "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__,
            "debian_torch": old.stdout.strip() or "not installed", "libblas.so.3": blas}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", default=os.path.join(HERE, "..", "build", "bench", "vitlens_bench"))
    parser.add_argument("--size", type=int, action="append", help="image sizes (default 64 128 224 448 1024)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--runs", type=int, default=9, help="most runs per median")
    parser.add_argument("--budget", type=float, default=20.0, help="seconds after which a median stops adding runs")
    parser.add_argument("--skip", action="append", default=[], help="a peer to leave out")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run vitlens and every peer this many times in turn; medians and ratios over rounds")
    parser.add_argument("--arch", choices=sorted(ARCHS), default="card",
                        help="card: the card's block (P 4, D 48, 4 heads, 1 block); vit_s16, vit_b16, vit_s8: those timm shapes")
    parser.add_argument("--precision", choices=["fp32", "bf16", "both"], default="fp32",
                        help="fp32: vitlens_bench --precision fp32 against the float32 peers; bf16: --precision bf16 "
                             "against the bfloat16 peers; both: both, each peer against vitlens in its precision")
    parser.add_argument("--save", action="store_true",
                        help="also write the table (or with --json the JSON) under bench/results/")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    set_arch(args.arch)
    if args.peer:
        run_peer(args.peer, args.size[0], args.threads, args.runs, args.budget, args.model_dir)
        return
    if not os.access(args.bench, os.X_OK):
        sys.exit(f"compare_peers.py: no vitlens_bench at {args.bench} (build it, or pass --bench)")
    if args.rounds < 1:
        sys.exit(f"compare_peers.py: --rounds must be at least 1, not {args.rounds}")
    sizes = args.size or [64, 128, 224, 448, 1024]
    precisions = {"fp32": ["fp32"], "bf16": ["bf16"], "both": ["fp32", "bf16"]}[args.precision]
    candidates = ((TORCH2_PEERS + TORCH113_PEERS if "fp32" in precisions else []) +
                  (BF16_PEERS if "bf16" in precisions else []))
    report = {"environment": {**environment(args.threads), "vitlens_precision": args.precision},
              "model": f"{args.arch}: P={PATCH} D={DIM} H={HEADS} d={HEAD_DIM}, {DEPTH} block(s), MLP 4D",
              "sizes": []}
    for size in sizes:
        tokens = (size // PATCH) ** 2 + 1
        row = {"image": size, "tokens": tokens}
        with tempfile.TemporaryDirectory(prefix="vitlens-peers-") as tmp:
            model = make_timm(size)
            model_path = os.path.join(tmp, "model.safetensors")
            write_vitlens_model(model, size, model_path)
            failed = {}  # peers that cannot run at this size: an export error or no memory for the maps
            for name, maps in (("onnx", False), ("onnx_maps", True)):
                if name in args.skip or name not in candidates:
                    continue
                if maps and not fits(size, 3):
                    failed[name] = {"skipped": "(H, N, N) tensors do not fit in memory"}
                    continue
                try:
                    export_onnx(model, size, os.path.join(tmp, f"{name}.onnx"), maps)
                except Exception as e:  # noqa: BLE001 (reported in the table)
                    failed[name] = {"error": f"export failed: {e}".splitlines()[0]}
            exported = {n for n in ("onnx", "onnx_maps") if os.path.exists(os.path.join(tmp, f"{n}.onnx"))}
            order = []
            for peer in candidates:
                if peer in args.skip or peer in failed or (peer.startswith("onnx") and peer not in exported):
                    continue
                with_maps = peer.endswith("weights") or peer.endswith("maps") or peer.endswith("plain")
                if not fits(size, 3 if with_maps else 1):
                    failed[peer] = {"skipped": "(H, N, N) tensors do not fit in memory"}
                    continue
                order.append(peer)
            if len(precisions) == 2 and OWN_FP32 not in args.skip:
                order.append(OWN_FP32)

            def run_vitlens(precision):
                out = subprocess.run([args.bench, "--json", "--model", model_path, "--size", str(size), "--threads",
                                      str(args.threads), "--runs", str(args.runs), "--budget", str(args.budget),
                                      "--no-export", "--no-limits", "--reference-max-tokens", "0",
                                      "--precision", precision],
                                     capture_output=True, text=True)
                if not out.stdout.strip():
                    return {"error": (out.stderr.strip().splitlines() or ["vitlens_bench failed"])[-1]}
                return json.loads(out.stdout)["sizes"][0]

            # --rounds R: vitlens and every peer, one after the other, R times, so that each round's
            # ratios compare runs minutes apart at most; the medians and ratios below are over rounds.
            rounds = []
            for _ in range(args.rounds):
                vit = {precision: run_vitlens(precision) for precision in precisions}
                peers = {}
                if OWN_FP32 in order:  # vitlens' own float32 forward, as a peer of its bf16 one
                    own = vit["fp32"]
                    peers[OWN_FP32] = ({"ms": own["forward_ms"]["median"], "runs": own["forward_ms"]["runs"],
                                        "peak_rss_mib": own["peak_rss_mib"]} if "error" not in own else own)
                for peer in (p for p in order if p != OWN_FP32):
                    python = SYSTEM_PYTHON if peer.startswith("torch113") else sys.executable
                    peers[peer] = peer_in_child(python, peer, size, args, tmp)
                rounds.append((vit, peers))
            row.update(summarise_rounds(rounds, order, precisions))
            row["peers"].update(failed)
        report["sizes"].append(row)
        print(f"compare_peers.py: {size} px done", file=sys.stderr)
    with open("/proc/loadavg") as f:
        report["environment"]["load_average_after"] = float(f.read().split()[0])
    text = json.dumps(report, indent=2) + "\n" if args.json else table(report)
    print(text, end="")
    if args.save:
        save_result(text, report, args)


def table(report):
    """The report as a Markdown table headed by the machine, threads, versions and date."""
    env = report["environment"]
    lines = [f"# vitlens vs peers, {report['model']}, {env['date']}, {env['cpu']} ({env['cores']} cores; "
             f"{' '.join(env['cpu_flags'])}), {env['threads']} threads each, vitlens --precision "
             f"{env['vitlens_precision']}, load average {env['load_average_before']:.1f} / "
             f"{env['load_average_after']:.1f}",
             f"# torch {env['torch']}, timm {env['timm']}, onnxruntime {env['onnxruntime']}, Debian torch "
             f"{env['debian_torch']} with libblas.so.3 = {env['libblas.so.3']}",
             "# medians in ms; ratio = peer / vitlens in the precision named (forward, or attention alone for "
             "sdpa / torch113_plain); peak RSS MiB of each process", "",
             "| image | tokens | peer | median ms | ratio | against | peak RSS MiB |",
             "|---:|---:|---|---:|---:|---|---:|"]
    for row in report["sizes"]:
        head = f"| {row['image']} | {row['tokens']} |"
        for precision, v in row["vitlens"].items():
            if "error" in v:
                lines.append(f"{head} vitlens {precision} | error: {v['error']} | | | |")
                continue
            lines.append(f"{head} vitlens {precision} forward | {v['forward_ms']:.4g} | 1 | | {v['peak_rss_mib']:.0f} |")
            lines.append(f"{head} vitlens {precision} attention | {v['attention_ms']:.4g} | | | |")
            if v.get("errors"):
                lines.append(f"{head} vitlens {precision} | failed in {len(v['errors'])} of {row['rounds']} rounds: "
                             f"{v['errors'][0]} | | | |")
        for peer, r in row["peers"].items():
            if "ms" not in r:
                lines.append(f"{head} {peer} | {r.get('error', r.get('skipped'))} | | | |")
                continue
            ratio = f"{r['ratio']:.2f}x" if "ratio" in r else ""
            if "ratio_min" in r and r["rounds"] > 1:
                ratio += f" ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
            name = peer + (f" (OpenBLAS {'/'.join(map(str, r['openblas_threads']))} thr)"
                           if "openblas_threads" in r else "")
            lines.append(f"{head} {name} | {r['ms']:.4g} | {ratio} | {r['against']} | {r['peak_rss_mib']:.0f} |")
    return "\n".join(lines) + "\n"


def save_result(text, report, args):
    """text into bench/results/<date>-peers-<arch>-<precision>-<threads>t.md (.json), written whole
    under a temporary name and linked into place, never over an existing file."""
    results = os.path.join(HERE, "results")
    date = report["environment"]["date"][:10]
    name = f"{date}-peers-{args.arch}-{args.precision}-{args.threads}t.{'json' if args.json else 'md'}"
    path = os.path.join(results, name)
    with tempfile.NamedTemporaryFile("w", dir=results, prefix=".peers-", delete=False) as f:
        f.write(text)
        temporary = f.name
    os.chmod(temporary, 0o644)  # NamedTemporaryFile makes it 0600
    try:
        os.link(temporary, path)  # fails if the file exists: a result is never overwritten
    except FileExistsError:
        sys.exit(f"compare_peers.py: {path} exists already; move it away to save this run")
    finally:
        os.unlink(temporary)
    print(f"compare_peers.py: wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
