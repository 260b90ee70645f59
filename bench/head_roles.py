#!/usr/bin/env python3
"""What the heads of a model do, measured with vitlens' head-role scores (README, "Head roles").

For every image, runs `vitlens export IMAGE --model MODEL --layer all` into a temporary folder and
reads each layer's JSON (heads[h].head_roles: the lift of the head's attention on high-affinity
keys for the edge, texture, colour and position affinities; 1.0 = no better than uniform). Prints,
per model, one Markdown table: for each layer and head the mean lift of each role over the images,
the role with the highest mean, and on how many images that role was the head's highest.

  bench/head_roles.py --vitlens build/app/vitlens --model M [--model M2 ...]
                      (--fashion-mnist N | --photos DIR [--limit N]) [--size S]

--fashion-mnist N: the first N test images of Debian's dataset-fashion-mnist (written as PGM files
into the temporary folder); --photos DIR: the images in DIR (sorted by name; the opencv-doc photos
are under /usr/share/doc/opencv-doc/examples/data), at most --limit of them. Only the standard
library is needed (any python3).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_common import idx_bytes

ROLES = ("edge", "texture", "colour", "position")
FASHION_DIR = "/usr/share/datasets/fashion-mnist"
PHOTO_EXT = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".ppm", ".pgm", ".webp")


def fashion_mnist_images(count, folder):
    """Writes the first `count` Fashion-MNIST test images as 28x28 PGM files; returns their paths."""
    path, data = idx_bytes(FASHION_DIR, "t10k-images-idx3-ubyte")
    n, h, w = (int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(3))
    if data[:4] != b"\x00\x00\x08\x03" or len(data) != 16 + n * h * w:
        sys.exit(f"{path}: not an IDX image file")
    paths = []
    for i in range(min(count, n)):
        out = os.path.join(folder, f"fmnist-test-{i:05d}.pgm")
        with open(out, "wb") as f:
            f.write(f"P5\n{w} {h}\n255\n".encode() + data[16 + i * h * w:16 + (i + 1) * h * w])
        paths.append(out)
    return paths


def photo_images(folder, limit):
    names = sorted(n for n in os.listdir(folder) if n.lower().endswith(PHOTO_EXT))
    return [os.path.join(folder, n) for n in names][:limit] if limit else [os.path.join(folder, n) for n in names]


def roles_of(vitlens, model, image, folder, size):
    """{(layer, head): {role: lift}} for one image, or None when vitlens refuses the image."""
    out = os.path.join(folder, "out")
    cmd = [vitlens, "export", image, "--model", model, "--layer", "all", "-o", out]
    if size:
        cmd += ["--size", str(size)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        print(f"skipped {image}: {run.stderr.strip()}", file=sys.stderr)
        return None
    stem = os.path.splitext(os.path.basename(image))[0]
    found = {}
    layer = 0
    while os.path.exists(os.path.join(out, f"{stem}_layer{layer}.json")):
        with open(os.path.join(out, f"{stem}_layer{layer}.json")) as f:
            record = json.load(f)
        for head in record["heads"]:
            found[(layer, head["head"])] = head["head_roles"]
        layer += 1
    for name in os.listdir(out):
        os.remove(os.path.join(out, name))
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vitlens", required=True, help="the vitlens binary")
    p.add_argument("--model", action="append", required=True, help="model file (repeatable)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--fashion-mnist", type=int, metavar="N", help="the first N Fashion-MNIST test images")
    src.add_argument("--photos", metavar="DIR", help="a folder of images")
    p.add_argument("--limit", type=int, default=0, help="--photos: at most N images")
    p.add_argument("--size", type=int, default=0, help="vitlens export --size (default: the model's)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="vitlens-roles-") as tmp:
        images = fashion_mnist_images(args.fashion_mnist, tmp) if args.fashion_mnist else photo_images(args.photos, args.limit)
        if not images:
            sys.exit("no images")
        for model in args.model:
            per_image = [r for r in (roles_of(args.vitlens, model, im, tmp, args.size) for im in images) if r]
            if not per_image:
                sys.exit(f"{model}: no image could be measured")
            print(f"\n{os.path.basename(model)}: mean lift over {len(per_image)} images"
                  f"{' at ' + str(args.size) + ' px' if args.size else ''}\n")
            print("| layer | head | " + " | ".join(ROLES) + " | highest | highest on |")
            print("|---:|---:|" + "---:|" * len(ROLES) + "---|---:|")
            for key in sorted(per_image[0]):
                means = {r: statistics.fmean(img[key][r] for img in per_image) for r in ROLES}
                top = max(ROLES, key=lambda r: means[r])
                wins = sum(1 for img in per_image if max(ROLES, key=lambda r: img[key][r]) == top)
                print(f"| {key[0]} | {key[1]} | " + " | ".join(f"{means[r]:.2f}" for r in ROLES) +
                      f" | {top} | {wins}/{len(per_image)} |")


if __name__ == "__main__":
    main()
