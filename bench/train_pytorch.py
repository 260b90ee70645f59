#!/usr/bin/env python3
"""The PyTorch peer of `vitlens train`: the same ViT, data, recipe and flags, in plain PyTorch.

Trains vitlens' classifier shape (timm's VisionTransformer layout: Conv2d patch embedding, class
token, learned positional table, pre-norm blocks with qkv-bias attention and an exact-GELU MLP,
final LayerNorm, class-token pooling, a linear head) on Fashion-MNIST read from the same IDX files
vitlens reads, with the recipe of `vitlens train`:

  AdamW (betas 0.9/0.999, eps 1e-8), weight decay on weight matrices only (not biases, norms,
  pos_embed, cls_token); linear warmup then cosine decay to 1e-5, per step; gradient norm clipped
  to 1.0; cross-entropy with optional label smoothing; optional stochastic depth (--drop-path,
  timm's DropPath per image, rates linspace(0, rate, depth)); with --augment, random crop with
  --crop-pad (default 1) px zero padding + horizontal flip (torchvision's RandomCrop(28, padding=1) + RandomHorizontalFlip, done
  here on the batch tensor);
  gray replicated to RGB, normalised (x - 0.5) / 0.5 after augmentation; the last partial batch of
  an epoch dropped; timm's initialisation.

Modes:
  (default)        train for --epochs, then print the test accuracy
  --steps N        train only N steps (timed), then evaluate
  --bench          time --steps steps (default 20) after --warmup-steps, print the median images/s

Runs with /work/venv's PyTorch 2.x and Debian 12's python3-torch 1.13 (no timm, no torchvision).
The last line printed is one JSON object (mode, images/s, accuracy, versions, BLAS, threads) for
bench/train_compare.sh.
"""
import argparse
import json
import math
import os
import re
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_common import idx_bytes

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
MIN_LR = 1e-5    # the end of vitlens train's cosine (Recipe::min_lr)
CLIP_NORM = 1.0  # Recipe::clip_norm
CROP_PAD = 1     # vitlens train --crop-pad default
MEAN, STD = 0.5, 0.5  # VitConfig's default mean / std, every channel


# ------------------------------------------------------------------------------------------------
# Data: the IDX files, as core/data/idx_reader.cpp reads them
# ------------------------------------------------------------------------------------------------

def read_idx(directory, name, ndim):
    """dir/name or dir/name.gz -> uint8 array of the header's shape (IDX: magic 0x0000 08 ndim)."""
    path, data = idx_bytes(directory, name)
    magic = struct.unpack(">I", data[:4])[0]
    if magic != 0x800 + ndim:
        sys.exit(f"{path}: bad magic 0x{magic:08x}, expected 0x{0x800 + ndim:08x}")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        sys.exit(f"{path}: {body.size} data bytes, header announces {int(np.prod(dims))}")
    return body.reshape(dims)


def load_fashion_mnist(directory, train, limit=0):
    """(n, 3, 28, 28) float32 in [0, 1] (gray replicated) and (n) int64 labels."""
    prefix = "train" if train else "t10k"
    images = read_idx(directory, prefix + "-images-idx3-ubyte", 3)
    labels = read_idx(directory, prefix + "-labels-idx1-ubyte", 1)
    if limit > 0:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1).expand(-1, 3, -1, -1).contiguous()
    return x, torch.from_numpy(labels.astype(np.int64))


def augment_crop_flip(x, pad, generator):
    """torchvision RandomCrop(padding=pad) + RandomHorizontalFlip on a batch (B, 3, H, W):
    zero-pad, one random H x W window per image, mirrored with probability 1/2."""
    b, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))                                   # (B, 3, H+2p, W+2p)
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    flip = torch.randint(0, 2, (b,), generator=generator).bool()
    cols = torch.arange(w).expand(b, w)
    cols = torch.where(flip[:, None], w - 1 - cols, cols) + dx[:, None]        # (B, W)
    rows = torch.arange(h)[None, :] + dy[:, None]                             # (B, H)
    batch = torch.arange(b)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # (B, H, W, 3)
    return out.permute(0, 3, 1, 2).contiguous()


# ------------------------------------------------------------------------------------------------
# The model: timm's VisionTransformer, written out (names match timm's state_dict)
# ------------------------------------------------------------------------------------------------

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")  # PyTorch >= 2.0; timm uses it when present


class Attention(nn.Module):
    def __init__(self, dim, heads, fused):
        super().__init__()
        self.heads, self.head_dim, self.fused = heads, dim // heads, fused
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):                                                     # (B, N, D)
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)                                               # (B, H, N, d)
        if self.fused:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)                     # (B, H, N, N)
            x = attn.softmax(dim=-1) @ v
        return self.proj(x.transpose(1, 2).reshape(b, n, d))


def drop_path(x, p, training, generator):
    """timm's DropPath (scale_by_keep): each image's branch kept with probability 1 - p and then
    scaled by 1 / (1 - p), else zeroed; identity in eval mode or for p = 0."""
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    mask = (torch.rand(x.shape[0], 1, 1, generator=generator) < keep).to(x.dtype)
    return x * (mask / keep)


class Block(nn.Module):
    def __init__(self, dim, heads, mlp_ratio, fused, drop_prob=0.0, generator=None):
        super().__init__()
        self.drop_prob, self.generator = drop_prob, generator
        hidden = int(dim * mlp_ratio)  # timm: int(), as VitConfig::mlp_hidden
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads, fused)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential()
        self.mlp.add_module("fc1", nn.Linear(dim, hidden))
        self.mlp.add_module("act", nn.GELU())  # exact (erf) GELU, as timm's default
        self.mlp.add_module("fc2", nn.Linear(hidden, dim))

    def forward(self, x):
        x = x + drop_path(self.attn(self.norm1(x)), self.drop_prob, self.training, self.generator)
        return x + drop_path(self.mlp(self.norm2(x)), self.drop_prob, self.training, self.generator)


class PatchEmbed(nn.Module):
    def __init__(self, patch, dim):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)

    def forward(self, x):                                                     # (B, 3, H, W)
        return self.proj(x).flatten(2).transpose(1, 2)                        # (B, gh*gw, D)


class VisionTransformer(nn.Module):
    def __init__(self, img, patch, dim, depth, heads, mlp_ratio, classes, fused, drop_path_rate=0.0, generator=None):
        super().__init__()
        tokens = (img // patch) ** 2
        dpr = [r.item() for r in torch.linspace(0, drop_path_rate, depth)]  # timm's stochastic depth rule
        self.patch_embed = PatchEmbed(patch, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + tokens, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads, mlp_ratio, fused, dpr[i], generator) for i in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)
        # timm init_weights(''): pos_embed trunc_normal(.02), cls_token normal(1e-6), Linear
        # trunc_normal(.02) + zero bias, LayerNorm 1 / 0, the patch Conv2d left at PyTorch's default.
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])                                             # class-token pooling


def param_groups(model, weight_decay):
    """Decay on weight matrices (and the patch Conv2d's 4-D weight) only: not 1-D parameters
    (biases, LayerNorm), not pos_embed, not cls_token."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim <= 1 or name in ("pos_embed", "cls_token") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def scheduled_lr(base, step, warmup, total):
    """vitlens' train::scheduled_lr: linear warmup to `base`, then cosine to MIN_LR."""
    if step < warmup:
        return base * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return MIN_LR + (base - MIN_LR) * 0.5 * (1.0 + math.cos(math.pi * t))


# ------------------------------------------------------------------------------------------------
# What runs underneath
# ------------------------------------------------------------------------------------------------

def set_openblas_threads(n):
    """openblas_set_num_threads(n) on every OpenBLAS loaded in this process (found in
    /proc/self/maps); returns the files it was set on. n = 0 leaves them as they are."""
    if n == 0:
        return []
    import ctypes
    with open("/proc/self/maps") as f:
        libs = sorted({line.split()[-1] for line in f if "libopenblas" in line and "/" in line})
    done = []
    for lib in libs:
        handle = ctypes.CDLL(lib)
        if hasattr(handle, "openblas_set_num_threads"):
            handle.openblas_set_num_threads(ctypes.c_int(n))
            done.append(lib)
    return done


def blas_in_use():
    """The BLAS libraries loaded in this process (threadpoolctl when installed, else /proc/self/maps),
    plus torch's own build record."""
    found = []
    try:
        from threadpoolctl import threadpool_info
        found = [f"{i.get('internal_api')} {i.get('version')} ({i.get('threading_layer', '?')}) {i.get('filepath')}"
                 for i in threadpool_info()]
    except ImportError:
        try:
            with open("/proc/self/maps") as f:
                libs = {line.split()[-1] for line in f if "/" in line}
            keys = ("blas", "mkl", "lapack", "dnnl", "gomp", "iomp")
            found = sorted(lib for lib in libs if any(k in os.path.basename(lib).lower() for k in keys))
        except OSError:
            pass
    # CUDA's cuBLAS is loaded by the CUDA wheels but never used on the CPU.
    found = [lib for lib in found if "cublas" not in lib and "/nvidia/" not in lib]
    # BLAS_INFO=mkl: MKL linked into libtorch_cpu (not listed above); generic: the system's
    # libblas.so.3 (Debian's alternatives pick OpenBLAS when libopenblas0-pthread is installed).
    build = re.findall(r"\b(?:BLAS_INFO|LAPACK_INFO|USE_MKL|USE_OPENMP)=\w+", torch.__config__.show())
    return {"loaded": found, "torch_build": build}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    # The flags and defaults of `vitlens train`.
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--embed-dim", type=int, default=48)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--mlp-ratio", type=float, default=2.0)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--epochs", type=int, default=24)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup", type=float, default=0.5, help="linear warmup, in epochs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0 = PyTorch's default")
    p.add_argument("--blas-threads", type=int, default=1,
                   help="threads of a separate OpenBLAS (Debian's torch 1.13: libblas.so.3), set with "
                        "openblas_set_num_threads; 0 = OpenBLAS's default (one per core). Default 1: its "
                        "pool spins against PyTorch's OpenMP threads (2 Dec: 323-378 images/s on 2 "
                        "threads with one per core, 735-839 with 1), and with one per core a 1-thread "
                        "run used both cores. No effect on PyTorch's own MKL (--threads sets that)")
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--drop-path", type=float, default=0.0, help="stochastic depth rate (timm's drop_path_rate)")
    p.add_argument("--crop-pad", type=int, default=CROP_PAD, help="--augment: zero padding of the random crop")
    p.add_argument("--augment", action=argparse.BooleanOptionalAction, default=True,
                   help="random crop (--crop-pad px padding) + flip; on by default, as vitlens train")
    p.add_argument("--limit", type=int, default=0, help="first N training (and test) images only")
    # This script's own.
    p.add_argument("--data-dir", default=FASHION_DIR)
    p.add_argument("--steps", type=int, default=0, help="train only N steps (the schedule still spans --epochs)")
    p.add_argument("--bench", action="store_true", help="time --steps steps (default 20), print the median images/s")
    p.add_argument("--warmup-steps", type=int, default=3, help="--bench: untimed steps first")
    p.add_argument("--attention", choices=["auto", "fused", "plain"], default="auto",
                   help="auto: F.scaled_dot_product_attention when this PyTorch has it (as timm), else plain")
    p.add_argument("--no-eval", action="store_true", help="skip the test-set evaluation")
    p.add_argument("--compare-grads", metavar="FILE",
                   help="check the model against `vitlens train --grad-dump FILE` (same flags): first-batch gradients")
    a = p.parse_args()
    for name in ("depth", "embed_dim", "heads", "patch", "batch", "epochs"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.embed_dim % a.heads:
        p.error(f"--embed-dim {a.embed_dim} is not divisible by --heads {a.heads}")
    if 28 % a.patch:
        p.error(f"28 is not a multiple of --patch {a.patch}")
    if a.attention == "fused" and not HAS_SDPA:
        p.error(f"--attention fused needs PyTorch >= 2.0 (this is {torch.__version__})")
    if not 0.0 <= a.drop_path < 1.0:
        p.error("--drop-path must be in [0, 1)")
    if a.crop_pad < 0:
        p.error("--crop-pad must be >= 0")
    if a.threads < 0 or a.steps < 0 or a.limit < 0 or a.blas_threads < 0:
        p.error("--threads, --blas-threads, --steps and --limit must be >= 0")
    return a


def read_safetensors(path):
    """{name: float32 tensor} from a safetensors file (8-byte little-endian header size, JSON
    header, raw little-endian data), without the safetensors package (Debian's Python lacks it)."""
    with open(path, "rb") as f:
        blob = f.read()
    size = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + size])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] != "F32":
            sys.exit(f"{path}: tensor {name} is {entry['dtype']}, expected F32")
        begin, end = entry["data_offsets"]
        data = np.frombuffer(blob, dtype="<f4", count=(end - begin) // 4, offset=8 + size + begin)
        out[name] = torch.from_numpy(data.copy()).reshape(entry["shape"])
    return out


def compare_grad_dump(a, model, x_train, y_train):
    """Checks that this script's model IS vitlens' model: loads the weights `vitlens train
    --grad-dump FILE` started from (FILE's .weights.safetensors), takes the gradients of the first
    --batch training images (file order, no augmentation) and compares them with FILE's."""
    grads = read_safetensors(a.compare_grads)
    stem = a.compare_grads[:-len(".safetensors")] if a.compare_grads.endswith(".safetensors") else a.compare_grads
    weights = read_safetensors(stem + ".weights.safetensors")
    params = dict(model.named_parameters())
    missing = sorted(set(params) ^ set(weights))
    if missing:
        sys.exit(f"names differ between this model and {stem}.weights.safetensors: {missing}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name].reshape(p.shape))
    xb = (x_train[:a.batch] - MEAN) / STD
    model.eval()  # no drop path, as vitlens' --grad-dump
    loss = nn.CrossEntropyLoss(label_smoothing=a.label_smoothing)(model(xb), y_train[:a.batch])
    model.zero_grad()
    loss.backward()
    worst = 0.0
    for name, p in params.items():
        theirs = grads[name].reshape(p.shape).double()
        diff = (p.grad.double() - theirs).abs().max().item() / max(theirs.abs().max().item(), 1e-12)
        worst = max(worst, diff)
        print(f"{name:32s} max |diff| / max |grad| = {diff:.2e}", file=sys.stderr)
    print(f"loss {loss.item():.6f}; largest relative gradient difference {worst:.2e} over {len(params)} tensors "
          f"({'OK' if worst <= 1e-4 else 'MISMATCH'}, tolerance 1e-4)")
    return 0 if worst <= 1e-4 else 1


@torch.no_grad()
def evaluate(model, x, y, batch):
    model.eval()
    correct, loss = 0, 0.0
    for i in range(0, x.shape[0], batch):
        xb = (x[i:i + batch] - MEAN) / STD
        logits = model(xb)
        loss += F.cross_entropy(logits, y[i:i + batch], reduction="sum").item()
        correct += (logits.argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return loss / x.shape[0], correct / x.shape[0]


def main():
    a = parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    openblas = set_openblas_threads(a.blas_threads)
    torch.manual_seed(a.seed)
    data_gen = torch.Generator().manual_seed(a.seed)
    fused = a.attention == "fused" or (a.attention == "auto" and HAS_SDPA)

    x_train, y_train = load_fashion_mnist(a.data_dir, True, a.limit)
    model = VisionTransformer(28, a.patch, a.embed_dim, a.depth, a.heads, a.mlp_ratio, 10, fused, a.drop_path, data_gen)
    opt = torch.optim.AdamW(param_groups(model, a.weight_decay), lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    if a.compare_grads:
        return compare_grad_dump(a, model, x_train, y_train)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=a.label_smoothing)
    n = x_train.shape[0]
    per_epoch = n // a.batch
    if per_epoch < 1:
        sys.exit(f"the training set has {n} images, fewer than one batch of {a.batch}")
    total = per_epoch * a.epochs
    warmup = round(a.warmup * per_epoch)
    steps = total
    if a.bench:
        steps = a.warmup_steps + (a.steps or 20)
    elif a.steps:
        steps = min(a.steps, total)

    info = {"torch": torch.__version__, "threads": torch.get_num_threads(), "attention": "fused sdpa" if fused else "plain",
            "blas": blas_in_use(), "params": sum(p.numel() for p in model.parameters()),
            "openblas_threads": a.blas_threads if openblas else None}
    print(f"PyTorch {info['torch']}, {info['threads']} threads, attention {info['attention']}, "
          f"{info['params']} parameters", file=sys.stderr)
    print(f"BLAS loaded: {'; '.join(info['blas']['loaded']) or 'none found'}; torch build: "
          f"{', '.join(info['blas']['torch_build'])}; OpenBLAS threads: {info['openblas_threads'] or 'not set'}",
          file=sys.stderr)

    step_times, order, pos, epoch = [], None, per_epoch, -1
    losses, correct, seen = [], 0, 0
    start = time.perf_counter()
    for step in range(steps):
        t0 = time.perf_counter()
        if pos == per_epoch:  # a new epoch: a fresh shuffle, the last partial batch dropped
            order, pos, epoch = torch.randperm(n, generator=data_gen), 0, epoch + 1
        idx = order[pos * a.batch:(pos + 1) * a.batch]
        pos += 1
        xb, yb = x_train[idx], y_train[idx]
        if a.augment:
            xb = augment_crop_flip(xb, a.crop_pad, data_gen)
        xb = (xb - MEAN) / STD
        lr = scheduled_lr(a.lr, step, warmup, total)
        for g in opt.param_groups:
            g["lr"] = lr
        logits = model(xb)
        loss = loss_fn(logits, yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        opt.step()
        step_times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        correct += (logits.argmax(1) == yb).sum().item()
        seen += a.batch
        if not a.bench and (pos == per_epoch or step + 1 == steps):
            rate = seen / sum(step_times[-pos:])
            print(f"epoch {epoch + 1}/{a.epochs} step {step + 1}/{steps} loss {statistics.fmean(losses):.4f} "
                  f"acc {100.0 * correct / seen:.1f}% {rate:.0f} img/s", file=sys.stderr)
            losses, correct, seen = [], 0, 0
    wall = time.perf_counter() - start

    result = {"mode": "bench" if a.bench else "steps" if a.steps else "train", "batch": a.batch,
              "depth": a.depth, "embed_dim": a.embed_dim, "heads": a.heads, "patch": a.patch, "mlp_ratio": a.mlp_ratio,
              "augment": a.augment, "crop_pad": a.crop_pad, "drop_path": a.drop_path, **info}
    timed = step_times[a.warmup_steps:] if a.bench else step_times
    result["steps_timed"] = len(timed)
    result["median_step_ms"] = 1000.0 * statistics.median(timed)
    result["images_per_s"] = a.batch / statistics.median(timed)  # median over the timed steps
    result["wall_s"] = wall
    if a.bench:
        print(f"median {result['images_per_s']:.0f} images/s over {len(timed)} steps "
              f"(batch {a.batch}, {info['threads']} threads, median step {result['median_step_ms']:.1f} ms)")
    elif not a.no_eval:
        x_test, y_test = load_fashion_mnist(a.data_dir, False, a.limit)
        test_loss, test_acc = evaluate(model, x_test, y_test, 500)
        result.update(test_loss=test_loss, test_accuracy=test_acc, test_images=int(x_test.shape[0]))
        print(f"test accuracy {100.0 * test_acc:.2f}% (loss {test_loss:.4f}) on {x_test.shape[0]} images after "
              f"{steps} steps; training {wall:.1f} s, median {result['images_per_s']:.0f} images/s")
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
