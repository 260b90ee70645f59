#!/work/venv/bin/python
"""How far a bfloat16 forward's attention is from float32's: vitlens --precision bf16 beside PyTorch's.

For each shipped model (assets/models, timm tensor names) and each photo in
/usr/share/doc/opencv-doc/examples/data (read at run time), the photo is resized to the model's
img_size once (PIL bicubic) and written as a PNG, so that every forward below reads the same pixels
(vitlens never resamples an image already at the model's size). Forwards:
  reference      timm VisionTransformer in float32 with the model's weights (vitlens' float32
                 forward equals it to 1e-5: tests/test_parity.cpp)
  vitlens_fp32   `vitlens export --raw --precision fp32`: every layer's (H, N, N) probabilities
  vitlens_bf16   `vitlens export --raw --precision bf16`
  torch_bf16     the timm model and the image in bfloat16 (model.to(torch.bfloat16))
  torch_autocast the float32 model under torch.autocast("cpu", dtype=torch.bfloat16)
and for each against the reference: the largest |P - P_ref| over every layer, head, row and key,
and the 8-bit colour index of the maps the viewer draws (every layer and head: attention received,
the column mean over the query rows, and the class token's row, each over the patches and scaled to
its maximum, then round(255 v / max)): the share of patches within 1 level and the worst level gap.

Usage: /work/venv/bin/python bench/bf16_accuracy.py --vitlens build/app/vitlens [--photos N] [--json]
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PHOTO_DIR = "/usr/share/doc/opencv-doc/examples/data"
MODELS = ["vitlens-mae-photos", "vitlens-fashion-mnist", "vitlens-designed"]


def photos(count):
    names = sorted(p for p in glob.glob(os.path.join(PHOTO_DIR, "*.jpg"))
                   if not os.path.basename(p).startswith(("left0", "right0")))  # 14 chessboards alike
    return names[:count]


def timm_model(path):
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file
    from timm.models.vision_transformer import VisionTransformer
    with safe_open(path, "pt") as f:
        cfg = json.loads(f.metadata()["config"])
    h, w = cfg["img_size"]
    model = VisionTransformer(img_size=(h, w), patch_size=cfg["patch_size"], embed_dim=cfg["embed_dim"],
                              depth=cfg["depth"], num_heads=cfg["num_heads"], mlp_ratio=cfg["mlp_ratio"],
                              qkv_bias=cfg.get("qkv_bias", True), class_token=True, num_classes=0,
                              global_pool="token",
                              norm_layer=lambda d, **kw: torch.nn.LayerNorm(d, eps=cfg["norm_eps"], **kw))
    state = {k: v.float() for k, v in load_file(path).items() if not k.startswith("head.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.startswith("head")]:
        raise SystemExit(f"bf16_accuracy.py: {path}: missing {missing}, unexpected {unexpected}")
    return model.eval(), cfg


def attention_probs(model, x):
    """Every block's softmax(q k^T * scale), (L, H, N, N) float32, as timm's unfused attention computes it."""
    import torch
    from compare_peers import forward_with_maps  # this folder
    with torch.inference_mode():
        _, maps = forward_with_maps(model, x)
    return np.stack([m[0].float().numpy() for m in maps])


def colour_indices(probs, prefix, grid):
    """(maps, patches) 8-bit indices: per layer and head, the received map then the class row."""
    patches = probs[..., prefix:]                     # (L, H, N, Np)
    received = patches.mean(axis=2)                   # (L, H, Np)
    cls_row = patches[:, :, 0, :]                     # (L, H, Np)
    maps = np.concatenate([received, cls_row]).reshape(-1, patches.shape[-1])
    top = maps.max(axis=1, keepdims=True)
    unit = np.clip(maps / np.where(top > 0, top, 1.0), 0.0, 1.0)
    return np.rint(unit.astype(np.float32) * np.float32(255.0)).astype(np.int32)


def compare(probs, ref, prefix, grid):
    levels = np.abs(colour_indices(probs, prefix, grid) - colour_indices(ref, prefix, grid))
    return {"worst_abs_dp": float(np.abs(probs - ref).max()), "patches": int(levels.size),
            "beyond_one_level": int((levels > 1).sum()), "worst_levels": int(levels.max())}


def vitlens_probs(binary, model_path, image_path, precision, tmp):
    out_dir = os.path.join(tmp, precision)  # the export names its files after the image: one folder each
    subprocess.run([binary, "export", image_path, "--model", model_path, "--raw", "--precision", precision,
                    "--out", out_dir, "--quiet"], check=True, capture_output=True, text=True)
    stem = os.path.splitext(os.path.basename(image_path))[0]
    return np.load(os.path.join(out_dir, f"{stem}_attn.npy"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vitlens", default=os.path.join(ROOT, "build", "app", "vitlens"))
    parser.add_argument("--photos", type=int, default=12)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import torch
    from PIL import Image
    torch.set_num_threads(os.cpu_count())
    pictures = photos(args.photos)
    if not pictures:
        sys.exit(f"bf16_accuracy.py: no photos in {PHOTO_DIR}")
    peers = ["vitlens_fp32", "vitlens_bf16", "torch_bf16", "torch_autocast"]
    totals = {}
    for name in MODELS:
        path = os.path.join(ROOT, "assets", "models", f"{name}.safetensors")
        model, cfg = timm_model(path)
        model_bf16 = timm_model(path)[0].to(torch.bfloat16)
        h, w = cfg["img_size"]
        mean, std = np.array(cfg["mean"], np.float32), np.array(cfg["std"], np.float32)
        grid = (h // cfg["patch_size"], w // cfg["patch_size"])
        for photo in pictures:
            with tempfile.TemporaryDirectory(prefix="vitlens-bf16-") as tmp:
                image_path = os.path.join(tmp, "image.png")
                Image.open(photo).convert("RGB").resize((w, h), Image.BICUBIC).save(image_path)
                pixels = (np.asarray(Image.open(image_path), np.float32) / 255.0 - mean) / std
                x = torch.from_numpy(pixels.transpose(2, 0, 1).copy())[None]
                ref = attention_probs(model, x)
                got = {"vitlens_fp32": vitlens_probs(args.vitlens, path, image_path, "fp32", tmp),
                       "vitlens_bf16": vitlens_probs(args.vitlens, path, image_path, "bf16", tmp),
                       "torch_bf16": attention_probs(model_bf16, x.to(torch.bfloat16))}
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    got["torch_autocast"] = attention_probs(model, x)
                for peer in peers:
                    r = compare(got[peer], ref, 1, grid)
                    t = totals.setdefault(name, {}).setdefault(peer, {"worst_abs_dp": 0.0, "patches": 0,
                                                                      "beyond_one_level": 0, "worst_levels": 0})
                    t["worst_abs_dp"] = max(t["worst_abs_dp"], r["worst_abs_dp"])
                    t["patches"] += r["patches"]
                    t["beyond_one_level"] += r["beyond_one_level"]
                    t["worst_levels"] = max(t["worst_levels"], r["worst_levels"])
        print(f"bf16_accuracy.py: {name} done", file=sys.stderr)
    import timm
    report = {"torch": torch.__version__, "timm": timm.__version__, "photos": [os.path.basename(p) for p in pictures],
              "models": totals}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"# bfloat16 against float32 (timm {timm.__version__}, torch {torch.__version__}), {len(pictures)} photos "
          f"from {PHOTO_DIR}; colour index of every layer's and head's received and class-token maps")
    print("| model | forward | worst abs dP | within 1 level | worst levels |")
    print("|---|---|---:|---:|---:|")
    for name, by_peer in totals.items():
        for peer, t in by_peer.items():
            share = 100.0 * (1.0 - t["beyond_one_level"] / t["patches"])
            print(f"| {name} | {peer} | {t['worst_abs_dp']:.3g} | {share:.3f} % of {t['patches']} | {t['worst_levels']} |")


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
