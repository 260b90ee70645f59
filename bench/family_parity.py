#!/work/venv/bin/python
"""Each family vitlens opens, against its library's own full pipeline from the image file.

For every family in FAMILIES the model is built with the real library (pretrained=False: no
network), at a small width and depth so it runs fast but with the family's real patch size, image
size and preprocessing config (timm: the pretrained tag's pretrained_cfg; transformers: the image
processor the example checkpoint publishes), with seeded noise on every parameter (attention far
from uniform). It is saved exactly as the library publishes it: timm's save_for_hf (model.safetensors
and config.json with pretrained_cfg), transformers' save_pretrained for the model and for its image
processor (preprocessor_config.json). Then, for each photo (read in place from Debian's opencv-doc
examples, never copied):

  library  the library's own pipeline from the file, as a notebook runs it:
             timm          PIL.Image.open(f).convert("RGB") -> resolve_model_data_config(model) ->
                           create_transform(**cfg) (eval) -> model.forward_features, every block's
                           attention after its softmax (the unfused path)
             transformers  AutoImageProcessor.from_pretrained(folder) (the default, torchvision
                           backend) and backend="pil" (Pillow's) on the PIL image -> the model with
                           output_attentions=True (eager attention)
           run in float64 on the float32 pixels the pipeline gave (the stored weights exactly); the
           same forward in float32 is reported too, as the library's own rounding.
  vitlens  `vitlens export IMAGE --model DIR/model.safetensors --preprocess model --raw`: every
           layer's (H, N, N) probabilities; and the normalised patches the forward read
           (build/bench/vitlens_preprocess_dump, the same calls as the CLI).

Reported per family: the worst |dP| over every layer, head, query and key, and the worst difference
of the normalised input pixels (with the worst gap in 8-bit levels after undoing mean and std).
For a model ending in an attention pool (pool=True: SigLIP, timm global_pool 'map') also the worst
difference of the pool's weights over the patch tokens: the library's own softmax (timm
AttentionPoolLatent unfused; transformers head.attention(probe, h, h, need_weights=True)) against
ForwardResult::pool_probs of the same forward, which vitlens_preprocess_dump writes as
<stem>_pool.npy. A family whose |dP| (blocks or pool) exceeds 1e-5 is flagged.

A new family is one entry in FAMILIES (timm: the architecture with its pretrained tag; transformers:
the model and config classes, the image processor and its arguments). Processors for transformers:
"torchvision" is AutoImageProcessor's default, read by vitlens from the file as saved (a processor
with no PIL twin, DINOv3's, sets pil=False); "pil" is
backend="pil", which a saved file does not record: vitlens reads the same file with its
image_processor_type ending in "Pil" (vitlens' documented selector); "hub file" is the legacy
preprocessor_config.json in which older model pages publish theirs (an int size,
feature_extractor_type, no image_processor_type: google/vit-base-patch16-224,
openai/clip-vit-base-patch16, facebook/deit-*), read by the default AutoImageProcessor.

Usage:
  /work/venv/bin/python bench/family_parity.py [--vitlens build/app/vitlens]
        [--dump build/bench/vitlens_preprocess_dump] [--only KEY[,KEY]] [--write] [--cpu TAG]
With --write the Markdown goes to bench/results/<date>-family-parity-<cpu>.md as well as stdout.
"""
import argparse
import dataclasses
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np
import PIL
import timm
import torch
import torchvision
import transformers
from PIL import Image
from timm.data import create_transform, resolve_model_data_config
from timm.models._hub import save_for_hf

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PHOTOS = "/usr/share/doc/opencv-doc/examples/data"
# (file, what it tests): several sizes and aspects; PNGs decode to the same bytes everywhere, the
# JPEG shows what a decoder difference would do.
IMAGES = [
    ("graf1.png", "landscape 800x640 RGB"),
    ("ml.png", "portrait 308x380 RGB"),
    ("templ.png", "small 100x130 RGBA (alpha dropped, enlarged)"),
    ("HappyFish.jpg", "small 259x194 JPEG"),
]
TOLERANCE = 1e-5

# Small but real: the family's own patch and image size, 2 blocks of width 48 with 3 heads.
TIMM_SMALL = dict(embed_dim=48, depth=2, num_heads=3)
HF_SMALL = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=192)
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@dataclasses.dataclass
class Family:
    key: str                      # row id and folder name
    label: str                    # the family as the README names it
    library: str                  # "timm" or "transformers"
    arch: str = ""                # timm: architecture.tag (the tag's pretrained_cfg is the transform)
    model_args: dict = dataclasses.field(default_factory=dict)     # beyond TIMM_SMALL / HF_SMALL
    model_class: str = ""         # transformers: the model class
    config_class: str = ""        # transformers: its config class
    processor_class: str = ""     # transformers: the image processor the example checkpoint uses
    processor_args: dict = dataclasses.field(default_factory=dict)
    hub_file: dict = None         # transformers: the legacy preprocessor_config.json of older pages
    tower: str = ""               # transformers: attribute holding the vision model ("vision_model")
    pil: bool = True              # transformers: the processor has a backend="pil" twin
    pool: bool = False            # the model ends in an attention pool: its weights are compared too


VIT_HUB = {"do_normalize": True, "do_resize": True, "feature_extractor_type": "ViTFeatureExtractor",
           "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 2, "size": 224}
CLIP_HUB = {"crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
            "feature_extractor_type": "CLIPFeatureExtractor", "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3, "size": 224}
DEIT_HUB = {"crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
            "feature_extractor_type": "DeiTFeatureExtractor", "image_mean": IMAGENET_MEAN, "image_std": IMAGENET_STD,
            "resample": 3, "size": 256}
DINOV2_PROCESSOR = dict(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}, do_center_crop=True,
                        resample=3, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)  # facebook/dinov2-*
DEIT_PROCESSOR = dict(image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)  # facebook/deit-*: the class's 256, crop 224

# Rotary families: a head width divisible by 4 (16 here), as the real models' 64.
SIGLIP_PROCESSOR = dict(size={"height": 224, "width": 224}, resample=3, image_mean=[0.5] * 3, image_std=[0.5] * 3)

FAMILIES = [
    Family("timm_vit", "timm ViT / AugReg", "timm", "vit_base_patch16_224.augreg2_in21k_ft_in1k"),
    Family("timm_deit_distilled", "timm DeiT, distilled", "timm", "deit_small_distilled_patch16_224.fb_in1k"),
    Family("timm_deit3", "timm DeiT III", "timm", "deit3_small_patch16_224.fb_in1k"),
    Family("timm_dino", "timm DINO", "timm", "vit_small_patch16_224.dino"),
    Family("timm_dinov2", "timm DINOv2", "timm", "vit_small_patch14_dinov2.lvd142m"),
    Family("timm_dinov2_reg", "timm DINOv2 with registers", "timm", "vit_small_patch14_reg4_dinov2.lvd142m"),
    Family("timm_clip", "timm CLIP image tower", "timm", "vit_base_patch16_clip_224.openai"),
    Family("timm_siglip_gap", "timm SigLIP (mean-pooled gap tower)", "timm", "vit_base_patch16_siglip_gap_224.webli"),
    Family("timm_rpn", "timm residual post-norm ViT", "timm", "vit_base_patch16_rpn_224.sw_in1k"),
    Family("timm_dinov3", "timm DINOv3", "timm", "vit_small_patch16_dinov3.lvd1689m"),
    Family("timm_dinov3_plus", "timm DINOv3 (SwiGLU, _plus)", "timm", "vit_small_plus_patch16_dinov3.lvd1689m"),
    Family("timm_eva02", "timm EVA-02", "timm", "eva02_small_patch14_224.mim_in22k"),
    Family("timm_dinov2_giant", "timm DINOv2 giant (SwiGLU packed)", "timm", "vit_giant_patch14_dinov2.lvd142m"),
    Family("timm_siglip", "timm SigLIP 2 with the attention pool", "timm", "vit_base_patch16_siglip_224.v2_webli",
           pool=True),
    Family("hf_vit", "Hugging Face ViTModel", "transformers", model_class="ViTModel", config_class="ViTConfig",
           model_args=dict(image_size=224, patch_size=16), processor_class="ViTImageProcessor", hub_file=VIT_HUB),
    Family("hf_vit_cls", "Hugging Face ViTForImageClassification", "transformers",
           model_class="ViTForImageClassification", config_class="ViTConfig",
           model_args=dict(image_size=224, patch_size=16, num_labels=5), processor_class="ViTImageProcessor",
           hub_file=VIT_HUB),
    Family("hf_dinov2", "Hugging Face Dinov2Model", "transformers", model_class="Dinov2Model",
           config_class="Dinov2Config", model_args=dict(image_size=518, patch_size=14, mlp_ratio=4),
           processor_class="BitImageProcessor", processor_args=DINOV2_PROCESSOR),
    Family("hf_dinov2_reg", "Hugging Face Dinov2WithRegistersModel", "transformers",
           model_class="Dinov2WithRegistersModel", config_class="Dinov2WithRegistersConfig",
           model_args=dict(image_size=518, patch_size=14, mlp_ratio=4, num_register_tokens=4),
           processor_class="BitImageProcessor", processor_args=DINOV2_PROCESSOR),
    Family("hf_dinov3", "Hugging Face DINOv3ViTModel", "transformers", model_class="DINOv3ViTModel",
           config_class="DINOv3ViTConfig", model_args=dict(image_size=224, patch_size=16, num_register_tokens=4),
           processor_class="DINOv3ViTImageProcessor", pil=False),  # facebook/dinov3-vits16-pretrain-lvd1689m
    Family("hf_siglip", "Hugging Face SiglipVisionModel", "transformers", model_class="SiglipVisionModel",
           config_class="SiglipVisionConfig", model_args=dict(image_size=224, patch_size=16),
           processor_class="SiglipImageProcessor", processor_args=SIGLIP_PROCESSOR, pool=True),  # google/siglip-base-patch16-224
    Family("hf_clip_vision", "Hugging Face CLIPVisionModel", "transformers", model_class="CLIPVisionModel",
           config_class="CLIPVisionConfig", model_args=dict(image_size=224, patch_size=16),
           processor_class="CLIPImageProcessor", hub_file=CLIP_HUB),
    Family("hf_deit", "Hugging Face DeiTModel", "transformers", model_class="DeiTModel", config_class="DeiTConfig",
           model_args=dict(image_size=224, patch_size=16), processor_class="DeiTImageProcessor",
           processor_args=DEIT_PROCESSOR, hub_file=DEIT_HUB),
    Family("hf_deit_teacher", "Hugging Face DeiTForImageClassificationWithTeacher", "transformers",
           model_class="DeiTForImageClassificationWithTeacher", config_class="DeiTConfig",
           model_args=dict(image_size=224, patch_size=16, num_labels=5), processor_class="DeiTImageProcessor",
           processor_args=DEIT_PROCESSOR, hub_file=DEIT_HUB),
]


# [SECTION] Models with noise on every parameter

TOKEN_NAMES = ("pos_embed", "position_embedding", "cls_token", "reg_token", "dist_token", "register_tokens",
               "mask_token", "class_embedding", "distillation_token")
GAIN = 1.7  # a weight matrix's std is GAIN / sqrt(fan_in): logits of a few units, attention far from uniform


def seed_of(key):
    return zlib.crc32(key.encode())


def randomize(model, seed):
    """Matrices N(0, GAIN^2 / fan_in); norm weights and LayerScale 1 + N(0, 0.1^2); biases and
    tokens N(0, 0.35^2). Drawn in float64 from one seeded generator, stored in the model's dtype."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if any(t in name for t in TOKEN_NAMES):
                p.copy_(0.35 * noise)
            elif p.dim() == 1 and (name.endswith("weight") or "gamma" in name or "lambda1" in name or "lambda2" in name):
                p.copy_(1.0 + 0.1 * noise)
            elif p.dim() >= 2:
                p.copy_(noise * (GAIN / np.sqrt(p[0].numel())))
            else:
                p.copy_(0.35 * noise)


def build_timm(fam, folder):
    kwargs = dict(TIMM_SMALL, **fam.model_args)
    model = timm.create_model(fam.arch, pretrained=False, **kwargs).eval()
    randomize(model, seed_of(fam.key))
    # model_args: what timm's hub config.json records for a model made with these arguments.
    save_for_hf(model, folder, model_args=kwargs, safe_serialization=True)
    return model


def build_hf(fam, folder):
    config = getattr(transformers, fam.config_class)(**dict(HF_SMALL, **fam.model_args))
    config._attn_implementation = "eager"  # so output_attentions returns the softmax weights
    model = getattr(transformers, fam.model_class)(config).eval()
    randomize(model, seed_of(fam.key))
    model.save_pretrained(folder, safe_serialization=True)
    getattr(transformers, fam.processor_class)(**fam.processor_args).save_pretrained(folder)
    return model


# [SECTION] The libraries' pipelines and attention

def photo(name):
    return Image.open(os.path.join(PHOTOS, name)).convert("RGB")


def capture_softmax(fn):
    """Runs fn() and returns (its result, every tensor Tensor.softmax returned meanwhile)."""
    seen = []
    original = torch.Tensor.softmax

    def recording(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        seen.append(out.detach().clone())
        return out

    torch.Tensor.softmax = recording
    try:
        result = fn()
    finally:
        torch.Tensor.softmax = original
    return result, seen


def timm_probs(model, x):
    """((L, H, N, N) every block's attention after its softmax, as timm computes it; (H, Np) the
    attention pool's weights over the patch tokens, or None). The blocks' attention is taken at
    attn.attn_drop, which both timm's ViT Attention and eva.py's EvaAttention (DINOv3, EVA-02) apply
    to the weights right after their softmax on the unfused path."""
    probs, hooks = [], []
    for block in model.blocks:
        block.attn.fused_attn = False  # the explicit softmax path, so attn can be captured
        hooks.append(block.attn.attn_drop.register_forward_hook(lambda _m, _i, o: probs.append(o[0].detach().clone())))
    pool = None
    try:
        with torch.no_grad():
            tokens = model.forward_features(x)
            if getattr(model, "attn_pool", None) is not None:
                model.attn_pool.fused_attn = False
                _, seen = capture_softmax(lambda: model.forward_head(tokens, pre_logits=True))
                assert len(seen) == 1, len(seen)
                pool = seen[0][0, :, 0].double().numpy()  # (H, Np): the latent query's row
    finally:
        for h in hooks:
            h.remove()
    assert len(probs) == len(model.blocks), (len(probs), len(model.blocks))  # one softmax per block, no other
    return torch.stack(probs).double().numpy(), pool


def hf_probs(fam, model, x):
    net = getattr(model, fam.tower) if fam.tower else model
    with torch.no_grad():
        out = net(pixel_values=x, output_attentions=True)
        pool = None
        if fam.pool:
            hidden = out.last_hidden_state
            # The head's own call, self.attention(probe, h, h), with the weights per head kept.
            _, w = net.head.attention(net.head.probe.to(hidden.dtype).expand(hidden.shape[0], -1, -1), hidden, hidden,
                                      need_weights=True, average_attn_weights=False)
            pool = w[0, :, 0].double().numpy()
    return torch.stack([a[0] for a in out.attentions]).double().numpy(), pool


def timm_pipelines(model, folder):
    """[(processor name, folder vitlens reads, pixels(image) -> (3, H, W) float32)]"""
    cfg = resolve_model_data_config(model)
    transform = create_transform(**cfg, is_training=False)
    with open(os.path.join(folder, "config.json")) as f:
        saved = json.load(f)["pretrained_cfg"]
    for k in ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std"):  # what vitlens reads
        if k in cfg and k in saved:
            assert list(np.atleast_1d(cfg[k])) == list(np.atleast_1d(saved[k])), (k, cfg[k], saved[k])
    desc = f"create_transform (PIL): {cfg['input_size'][1]}x{cfg['input_size'][2]}, crop_pct {cfg['crop_pct']}, " \
           f"{cfg['crop_mode']}, {cfg['interpolation']}"
    return [(desc, folder, lambda img: transform(img).numpy())]


def hf_pipelines(fam, folder, work):
    def run(proc):
        return lambda img: proc(images=img, return_tensors="pt")["pixel_values"][0].numpy().astype(np.float32)

    default = transformers.AutoImageProcessor.from_pretrained(folder)
    out = [(f"{type(default).__name__} (default, torchvision)", folder, run(default))]
    if not fam.pil:  # a processor with only the torchvision backend
        return out
    pil = transformers.AutoImageProcessor.from_pretrained(folder, backend="pil")
    assert type(pil).__name__.endswith("Pil"), type(pil).__name__
    marked = os.path.join(work, fam.key + "_pil")  # the same files, the processor type marked "...Pil"
    shutil.copytree(folder, marked)
    path = os.path.join(marked, "preprocessor_config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["image_processor_type"] = type(pil).__name__
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    out.append((f"{type(pil).__name__} (backend=\"pil\")", marked, run(pil)))
    if fam.hub_file:
        legacy = os.path.join(work, fam.key + "_hub")
        shutil.copytree(folder, legacy)
        with open(os.path.join(legacy, "preprocessor_config.json"), "w") as f:
            json.dump(fam.hub_file, f, indent=2)
        proc = transformers.AutoImageProcessor.from_pretrained(legacy)
        out.append((f"{type(proc).__name__} from the hub's legacy file", legacy, run(proc)))
    return out


# [SECTION] vitlens

def vitlens_run(exe, dump, folder, out, images):
    """{image: (probs (L, H, N, N) float32, patches (gh*gw, 3*P*P) float32, pool (H, Np) float32 or
    None)} or an error string."""
    os.makedirs(out, exist_ok=True)
    model = os.path.join(folder, "model.safetensors")
    paths = [os.path.join(PHOTOS, name) for name, _ in images]
    r = subprocess.run([exe, "export", *paths, "--model", model, "--preprocess", "model", "--raw", "--out", out,
                        "--quiet", "--force"], capture_output=True, text=True)
    if r.returncode != 0:
        return "vitlens export: " + (r.stderr.strip().splitlines() or ["exit code %d" % r.returncode])[-1]
    r = subprocess.run([dump, "--model", model, "--out", out, *paths], capture_output=True, text=True)
    if r.returncode != 0:
        return "vitlens_preprocess_dump: " + (r.stderr.strip().splitlines() or ["exit code %d" % r.returncode])[-1]
    result = {}
    for name, _ in images:
        stem = os.path.splitext(name)[0]
        with open(os.path.join(out, stem + ".json")) as f:
            record = json.load(f)
        assert record.get("preprocess") == "model", record.get("preprocess")
        pool = os.path.join(out, stem + "_pool.npy")  # written for a model with an attention pool
        result[name] = (np.load(os.path.join(out, stem + "_attn.npy")), np.load(os.path.join(out, stem + "_pixels.npy")),
                        np.load(pool) if os.path.exists(pool) else None)
    return result


def to_patches(x, p):
    """(3, H, W) -> (gh*gw, 3*P*P), each row (c, y, x): the layout of vitlens' PatchGrid."""
    c, h, w = x.shape
    gh, gw = h // p, w // p
    return x[:, :gh * p, :gw * p].reshape(c, gh, p, gw, p).transpose(1, 3, 0, 2, 4).reshape(gh * gw, c * p * p)


def levels(patches, mean, std, p):
    """Normalised patches back to 8-bit levels (float64, rounded)."""
    m = np.repeat(np.asarray(mean, np.float64), p * p)
    s = np.repeat(np.asarray(std, np.float64), p * p)
    return np.round((patches.astype(np.float64) * s + m) * 255.0)


# [SECTION] One family

def measure(fam, args, work):
    folder = os.path.join(work, fam.key)
    t0 = time.perf_counter()
    model = build_timm(fam, folder) if fam.library == "timm" else build_hf(fam, folder)
    if fam.library == "timm":
        pipelines = timm_pipelines(model, folder)
        patch = model.patch_embed.patch_size[0]
        version = f"timm {timm.__version__}"
    else:
        pipelines = hf_pipelines(fam, folder, work)
        patch = model.config.patch_size
        version = f"transformers {transformers.__version__}"
    model64 = model
    rows = []
    for proc_name, vitlens_folder, pipeline in pipelines:
        got = vitlens_run(args.vitlens, args.dump, vitlens_folder, os.path.join(work, "out", os.path.basename(vitlens_folder)),
                          IMAGES)
        row = dict(family=fam.label, key=fam.key, library=version, processor=proc_name, images=[], error=None)
        if isinstance(got, str):
            row["error"] = got
            rows.append(row)
            continue
        for name, what in IMAGES:
            x32 = torch.from_numpy(pipeline(photo(name))[None])
            model64.float()
            ref32, pool32 = timm_probs(model64, x32) if fam.library == "timm" else hf_probs(fam, model64, x32)
            model64.double()
            ref, pool_ref = timm_probs(model64, x32.double()) if fam.library == "timm" else hf_probs(fam, model64, x32.double())
            probs, patches, pool = got[name]
            entry = dict(image=name, what=what, size=list(x32.shape[2:]), tokens=int(ref.shape[-1]))
            if probs.shape != ref.shape:
                entry["error"] = f"vitlens attention {probs.shape}, library {ref.shape}"
            else:
                entry["dP"] = float(np.abs(probs.astype(np.float64) - ref).max())
                entry["dP_torch32"] = float(np.abs(ref32 - ref).max())
                entry["max_weight"] = float(ref.max())
            if fam.pool:  # the attention pool's latent query over the patch tokens, (H, Np)
                if pool is None or pool_ref is None or pool.shape != pool_ref.shape:
                    entry["error"] = entry.get("error", "") + f" pool: vitlens {None if pool is None else pool.shape}, " \
                                     f"library {None if pool_ref is None else pool_ref.shape}"
                else:
                    entry["dPool"] = float(np.abs(pool.astype(np.float64) - pool_ref).max())
                    entry["dPool_torch32"] = float(np.abs(pool32 - pool_ref).max())
            lib = to_patches(x32[0].numpy(), patch)
            if lib.shape != patches.shape:
                entry["error"] = entry.get("error", "") + f" pixels: vitlens {patches.shape}, library {lib.shape}"
            else:
                entry["dx"] = float(np.abs(patches.astype(np.float64) - lib.astype(np.float64)).max())
                mean, std = pipeline_mean_std(fam, model, vitlens_folder)
                entry["dlevel"] = int(np.abs(levels(patches, mean, std, patch) - levels(lib, mean, std, patch)).max())
            row["images"].append(entry)
        rows.append(row)
    for row in rows:
        row["seconds"] = time.perf_counter() - t0
    return rows


def pipeline_mean_std(fam, model, folder):
    if fam.library == "timm":
        cfg = model.pretrained_cfg
        return cfg.get("mean", IMAGENET_MEAN), cfg.get("std", IMAGENET_STD)
    with open(os.path.join(folder, "preprocessor_config.json")) as f:
        cfg = json.load(f)
    return cfg.get("image_mean", [0.5] * 3), cfg.get("image_std", [0.5] * 3)


# [SECTION] Report

def cpu_name():
    name = ""
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f if ":" in line and line.strip())
        info = {k.strip(): v.strip() for k, v in info.items()}
        name = info.get("model name", "")
        if info.get("vendor_id") == "AuthenticAMD":
            fam, mod = int(info.get("cpu family", 0)), int(info.get("model", 0))
            zen = {23: "zen2" if mod >= 0x30 else "zen", 25: "zen4" if 0x10 <= mod < 0x20 or mod >= 0x60 else "zen3",
                   26: "zen5"}.get(fam, "amd")
            return name, zen
        if info.get("vendor_id") == "GenuineIntel":
            return name, "xeon" if "Xeon" in name else "intel"
    except OSError:
        pass
    return name or platform.processor(), platform.machine()


def fmt(x):
    return "–" if x is None else f"{x:.1e}"


def worst(row, key, jpeg):
    vals = [e[key] for e in row["images"] if key in e and e["image"].endswith(".jpg") == jpeg]
    return max(vals) if vals else None


def markdown(rows, seconds, cpu, only):
    lines = []
    today = datetime.date.today().isoformat()
    lines.append(f"# Family parity: vitlens against each library's own pipeline from the image file ({today})")
    lines.append("")
    lines.append(f"Machine: {cpu[0]} ({cpu[1]}), {os.cpu_count()} cores; timm {timm.__version__}, transformers "
                 f"{transformers.__version__}, torch {torch.__version__}, torchvision {torchvision.__version__}, "
                 f"Pillow {PIL.__version__}. `bench/family_parity.py`{' --only ' + only if only else ''}, "
                 f"{seconds:.0f} s.")
    lines.append("")
    lines.append("Images (read in place from " + PHOTOS + "): " +
                 "; ".join(f"`{n}` {w}" for n, w in IMAGES) + ".")
    lines.append("")
    lines.append("|dP|: the largest difference of an attention probability (every layer, head, query and key) "
                 "between `vitlens export --preprocess model --raw` and the library's forward in float64 on the "
                 "library's pipeline pixels. Pixels: the largest difference of a normalised input value (8-bit "
                 "levels apart in brackets). PNG and JPEG apart: the JPEG adds the two decoders' difference.")
    lines.append("")
    lines.append("Pool: for a model ending in an attention pool (SigLIP, timm global_pool 'map'), the largest difference "
                 "of the pool's latent-query weight over the patch tokens (every head; the library's own call: timm "
                 "AttentionPoolLatent's softmax, transformers' head.attention with need_weights), over all 4 images; "
                 "vitlens' from the same forward the export runs (ForwardResult::pool_probs, written by "
                 "vitlens_preprocess_dump); the library's float32 pool against float64 in brackets.")
    lines.append("")
    lines.append("| family | library | processor | worst &#124;dP&#124; (PNG) | worst pixel diff (PNG) | "
                 "JPEG &#124;dP&#124; | JPEG pixels | library fp32 vs fp64 &#124;dP&#124; | pool &#124;dP&#124; |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if row["error"]:
            lines.append(f"| {row['family']} | {row['library']} | {row['processor']} | **{row['error']}** | | | | | |")
            continue
        errors = [e for e in row["images"] if "error" in e]
        dp, dpj = worst(row, "dP", False), worst(row, "dP", True)
        flag = " **over 1e-5**" if any(v is not None and v > TOLERANCE for v in (dp, dpj)) else ""
        px = worst(row, "dx", False)
        pxl = worst(row, "dlevel", False)
        pj, pjl = worst(row, "dx", True), worst(row, "dlevel", True)
        t32 = max((e["dP_torch32"] for e in row["images"] if "dP_torch32" in e), default=None)
        dpool = max((e["dPool"] for e in row["images"] if "dPool" in e), default=None)
        tpool = max((e["dPool_torch32"] for e in row["images"] if "dPool_torch32" in e), default=None)
        pool_cell = "–" if dpool is None else f"{fmt(dpool)}{' **over 1e-5**' if dpool > TOLERANCE else ''} ({fmt(tpool)})"
        note = "; ".join(f"{e['image']}: {e['error']}" for e in errors)
        lines.append(f"| {row['family']} | {row['library']} | {row['processor']} | {fmt(dp)}{flag}{' ' + note if note else ''} | "
                     f"{fmt(px)} ({pxl} levels) | {fmt(dpj)} | {fmt(pj)} ({pjl} levels) | {fmt(t32)} | {pool_cell} |")
    lines.append("")
    lines.append("Per image (model input size, tokens, largest attention weight, |dP|, pixel diff):")
    lines.append("")
    lines.append("| family | processor | image | input | tokens | max weight | &#124;dP&#124; | pixels |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for row in rows:
        for e in row["images"]:
            lines.append(f"| {row['key']} | {row['processor']} | {e['image']} | {e['size'][1]}x{e['size'][0]} | "
                         f"{e['tokens']} | {e.get('max_weight', 0):.3f} | {fmt(e.get('dP'))} | {fmt(e.get('dx'))} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vitlens", default=os.path.join(ROOT, "build/app/vitlens"))
    parser.add_argument("--dump", default=os.path.join(ROOT, "build/bench/vitlens_preprocess_dump"))
    parser.add_argument("--only", default="", help="comma-separated family keys")
    parser.add_argument("--write", action="store_true", help="also write bench/results/<date>-family-parity-<cpu>.md")
    parser.add_argument("--cpu", default="", help="the CPU's short name in the results file's name")
    parser.add_argument("--keep", default="", help="keep the saved models and outputs in this folder")
    args = parser.parse_args()
    for exe in (args.vitlens, args.dump):
        if not os.access(exe, os.X_OK):
            sys.exit(f"family_parity.py: {exe} is not an executable (build the vitlens and vitlens_preprocess_dump targets)")
    keys = [k for k in args.only.split(",") if k]
    unknown = [k for k in keys if k not in {f.key for f in FAMILIES}]
    if unknown:
        sys.exit(f"family_parity.py: unknown family {', '.join(unknown)}; known: {', '.join(f.key for f in FAMILIES)}")
    families = [f for f in FAMILIES if not keys or f.key in keys]
    torch.set_num_threads(2)
    start = time.perf_counter()
    work = args.keep or tempfile.mkdtemp(prefix="family_parity_")
    rows = []
    try:
        for fam in families:
            got = measure(fam, args, work)
            for row in got:
                dp = max((e.get("dP", 0) for e in row["images"]), default=None)
                dpool = max((e.get("dPool", 0) for e in row["images"]), default=0)
                errs = "; ".join(e["error"] for e in row["images"] if "error" in e)
                print(f"{fam.key:20s} {row['processor'][:48]:48s} {row['error'] or f'|dP| {dp:.1e}'}"
                      f"{f' pool {dpool:.1e}' if fam.pool else ''}{' ' + errs if errs else ''} "
                      f"({row['seconds']:.0f} s)", file=sys.stderr, flush=True)
            rows += got
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    seconds = time.perf_counter() - start
    cpu = cpu_name()
    text = markdown(rows, seconds, cpu, args.only)
    print(text)
    if args.write:
        path = os.path.join(HERE, "results", f"{datetime.date.today().isoformat()}-family-parity-{args.cpu or cpu[1]}.md")
        with open(path, "w") as f:
            f.write(text)
        print(f"written: {os.path.relpath(path, ROOT)}", file=sys.stderr)
    failed = [r for r in rows if r["error"] or any("error" in e or e.get("dP", 0) > TOLERANCE or
                                                   e.get("dPool", 0) > TOLERANCE for e in r["images"])]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
