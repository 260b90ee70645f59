// A checkpoint's published preprocessing (timm pretrained_cfg, transformers
// preprocessor_config.json) as an ImageTransform, and its library's positional-table resize.
#include "models/model_transform.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <sys/stat.h>

#include "core/base/error.hpp"
#include "core/io/files.hpp"  // read_whole_file
#include "core/io/paths.hpp"
#include "models/json_file.hpp"

namespace vitlens {

namespace {

using nlohmann::json;

constexpr uint64_t kMaxConfigBytes = uint64_t{4} << 20;  // a config is a few KB
constexpr int kMaxTransformSide = 16384;                   // as the model configs' img_size
constexpr double kMinCropPct = 0.5;                        // timm_transform says why

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

json read_json_file(const std::string& path) {
  json j = parse_json_text(read_whole_file(path, "a model's config file", kMaxConfigBytes), path, kMaxModelNameBytes);
  if (!j.is_object()) throw Error(path + " is not a JSON object");
  return j;
}

// [SECTION] Checked values: every refusal names the file and the key.

struct Reader {
  const json& j;
  std::string file;

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw Error(file + ": '" + key + "' " + why);
  }
  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j.at(key).is_boolean()) fail(key, "is not true or false");
    return j.at(key).get<bool>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j.at(key).is_number()) fail(key, "is not a number");
    return j.at(key).get<double>();
  }
  int side(const json& v, const std::string& key) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxTransformSide)
      fail(key, "is not a size in [1, " + std::to_string(kMaxTransformSide) + "]");
    return static_cast<int>(v.get<int64_t>());
  }
  std::array<float, 3> triple(const char* key, const std::array<float, 3>& fallback, bool positive) const {
    if (!has(key)) return fallback;
    const json& v = j.at(key);
    std::array<float, 3> out{};
    if (v.is_number()) {
      out.fill(v.get<float>());
    } else {
      if (!v.is_array() || v.size() != 3) fail(key, "is not a number or a list of 3 numbers");
      for (size_t i = 0; i < 3; ++i) {
        if (!v[i].is_number()) fail(key, "is not a list of 3 numbers");
        out[i] = v[i].get<float>();
      }
    }
    for (float x : out)
      if (!std::isfinite(x) || (positive && x <= 0.0f)) fail(key, positive ? "has a value that is not > 0" : "has a value that is not finite");
    return out;
  }
};

constexpr std::array<float, 3> kImagenetMean{0.485f, 0.456f, 0.406f}, kImagenetStd{0.229f, 0.224f, 0.225f};
constexpr std::array<float, 3> kHalf{0.5f, 0.5f, 0.5f};
constexpr std::array<float, 3> kClipMean{0.48145466f, 0.4578275f, 0.40821073f};
constexpr std::array<float, 3> kClipStd{0.26862954f, 0.26130258f, 0.27577711f};

// [SECTION] timm pretrained_cfg -> create_transform's eval pipeline (transforms_factory.py)

ResampleFilter timm_filter(const Reader& r) {
  // resolve_data_config: bicubic unless the config names one; str_to_interp_mode's names.
  const std::string name = r.has("interpolation") && r.j.at("interpolation").is_string()
                               ? r.j.at("interpolation").get<std::string>() : "bicubic";
  if (name == "bicubic") return ResampleFilter::Bicubic;
  if (name == "bilinear") return ResampleFilter::Bilinear;
  if (name == "box") return ResampleFilter::Box;
  if (name == "hamming") return ResampleFilter::Hamming;
  if (name == "lanczos") return ResampleFilter::Lanczos;
  r.fail("interpolation", "is '" + name + "'; vitlens reproduces bicubic, bilinear, box, hamming and lanczos");
}

ImageTransform timm_transform(const json& pre, const std::string& file) {
  const Reader r{pre, file + " pretrained_cfg"};
  ImageTransform t;
  t.origin = file + " pretrained_cfg";
  t.library = "timm eval transform (PIL)";
  if (!r.has("input_size") || !pre.at("input_size").is_array() || pre.at("input_size").size() != 3)
    r.fail("input_size", "is missing or not [3, H, W]");
  const int h = r.side(pre.at("input_size")[1], "input_size"), w = r.side(pre.at("input_size")[2], "input_size");
  double crop_pct = r.number("crop_pct", 0.875);  // timm DEFAULT_CROP_PCT
  if (crop_pct == 0.0) crop_pct = 0.875;          // `crop_pct or DEFAULT_CROP_PCT`
  if (crop_pct > 1.0) r.fail("crop_pct", "is above 1 (a larger crop pads, which vitlens does not)");
  // timm's own configs keep 0.875 to 1.0 of the resized image; below half, the resize would be
  // over twice the crop and throw most of the image away, which no published checkpoint does. A
  // value like 1e-9 is a damaged config (it would ask for a resize to billions of pixels a side).
  if (!(crop_pct >= kMinCropPct))
    r.fail("crop_pct", "is " + number_text(crop_pct) + ", not in [" + number_text(kMinCropPct) +
                           ", 1] (timm's configs use 0.875 to 1)");
  const std::string mode = r.has("crop_mode") && pre.at("crop_mode").is_string() ? pre.at("crop_mode").get<std::string>() : "center";
  t.filter = timm_filter(r);
  t.engine = ResampleEngine::Pillow;
  // scale_size = floor(x / crop_pct) per side, in Python's double; bounded before it becomes an int.
  const double scale_hd = std::floor(h / crop_pct), scale_wd = std::floor(w / crop_pct);
  if (std::max(scale_hd, scale_wd) > kMaxTransformSide)
    r.fail("crop_pct", "is " + number_text(crop_pct) + ", which with input_size " + std::to_string(h) + "x" +
                           std::to_string(w) + " resizes to " + number_text(std::max(scale_hd, scale_wd)) +
                           " px a side, more than " + std::to_string(kMaxTransformSide));
  const int scale_h = static_cast<int>(scale_hd), scale_w = static_cast<int>(scale_wd);
  if (mode == "center") {
    if (scale_h != scale_w)
      r.fail("input_size", "is not square; timm's center crop then resizes with ResizeKeepRatio, which vitlens does not reproduce");
    t.resize = ResizeRule::ShortestEdge;
    t.resize_short = scale_h;
  } else if (mode == "squash") {
    t.resize = ResizeRule::Exact;
    t.resize_w = scale_w;
    t.resize_h = scale_h;
  } else {
    r.fail("crop_mode", "is '" + mode + "'; vitlens reproduces center and squash");
  }
  t.center_crop = true;  // torchvision CenterCrop(img_size): a no-op when the sizes match
  t.crop_w = w;
  t.crop_h = h;
  t.crop_rounding = CropRounding::TorchvisionRound;
  t.mean = r.triple("mean", kImagenetMean, false);
  t.std = r.triple("std", kImagenetStd, true);
  return t;
}

// [SECTION] transformers preprocessor_config.json -> its image processor

struct HfDefaults {
  const char* type;  // image_processor_type without "Fast"/"Pil"
  int resample;
  bool center_crop;
  bool square;       // a plain number as size means S x S (get_size_dict's default_to_square), else shortest edge S
  int size;          // the class's default size, in the same sense
  std::array<float, 3> mean, std;
};
// The processors of the families vitlens opens, with transformers' class defaults.
constexpr HfDefaults kHfDefaults[] = {
    {"ViTImageProcessor", 2, false, true, 224, kHalf, kHalf},
    {"CLIPImageProcessor", 3, true, false, 224, kClipMean, kClipStd},
    {"BitImageProcessor", 3, true, false, 224, kClipMean, kClipStd},
    {"Dinov2ImageProcessor", 3, true, false, 224, kImagenetMean, kImagenetStd},
    {"DeiTImageProcessor", 3, true, true, 256, kHalf, kHalf},
    {"SiglipImageProcessor", 3, false, true, 224, kHalf, kHalf},
    {"DINOv3ViTImageProcessor", 2, false, true, 224, kImagenetMean, kImagenetStd},
};

bool ends_with(const std::string& s, const char* tail) {
  const size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

ResampleFilter pil_resample(int code, const Reader& r) {
  switch (code) {  // PIL.Image.Resampling
    case 1: return ResampleFilter::Lanczos;
    case 2: return ResampleFilter::Bilinear;
    case 3: return ResampleFilter::Bicubic;
    case 4: return ResampleFilter::Box;
    case 5: return ResampleFilter::Hamming;
    default: r.fail("resample", "is " + std::to_string(code) + "; vitlens reproduces 1 (lanczos) to 5, not nearest");
  }
}

ImageTransform hf_transform(const json& j, const std::string& file) {
  const Reader r{j, file};
  std::string type = r.has("image_processor_type") && j.at("image_processor_type").is_string()
                         ? j.at("image_processor_type").get<std::string>() : "";
  // Files written before image processors existed (google/vit-base-patch16-224,
  // openai/clip-vit-base-patch16, facebook/deit-*) name only the feature extractor, which
  // transformers maps to the image processor of the same name.
  if (type.empty() && r.has("feature_extractor_type") && j.at("feature_extractor_type").is_string()) {
    type = j.at("feature_extractor_type").get<std::string>();
    if (ends_with(type, "FeatureExtractor")) type = type.substr(0, type.size() - 16) + "ImageProcessor";
  }
  ImageTransform t;
  t.origin = file;
  t.engine = ends_with(type, "Pil") ? ResampleEngine::Pillow : ResampleEngine::TorchAntialias;
  if (ends_with(type, "Pil")) type.resize(type.size() - 3);
  if (ends_with(type, "Fast")) type.resize(type.size() - 4);
  const HfDefaults* defaults = nullptr;
  for (const HfDefaults& d : kHfDefaults)
    if (type == d.type) defaults = &d;
  auto need = [&](const char* key) {
    if (!defaults && !r.has(key)) r.fail(key, "is missing and image_processor_type '" + type + "' has no default vitlens knows");
  };
  t.library = "transformers " + (type.empty() ? std::string("image processor") : type) +
              (t.engine == ResampleEngine::Pillow ? " (PIL backend)" : " (torchvision backend)");
  if (r.boolean("do_resize", true)) {
    need("size");
    if (r.has("size")) {
      const json& size = j.at("size");
      if (size.is_object() && size.contains("shortest_edge") && !size.at("shortest_edge").is_null()) {
        if (size.contains("longest_edge") && !size.at("longest_edge").is_null())
          r.fail("size", "has a longest_edge, which vitlens does not reproduce");
        t.resize = ResizeRule::ShortestEdge;
        t.resize_short = r.side(size.at("shortest_edge"), "size.shortest_edge");
      } else if (size.is_object() && size.contains("height") && size.contains("width")) {
        t.resize = ResizeRule::Exact;
        t.resize_h = r.side(size.at("height"), "size.height");
        t.resize_w = r.side(size.at("width"), "size.width");
      } else if (size.is_number_integer()) {  // the older files' form: its meaning is the class's
        if (!defaults)
          r.fail("size", "is a plain number, which means S x S or shortest edge S depending on the processor; "
                         "image_processor_type '" + type + "' is not one vitlens knows");
        t.resize = defaults->square ? ResizeRule::Exact : ResizeRule::ShortestEdge;
        t.resize_short = t.resize_w = t.resize_h = r.side(size, "size");
      } else {
        r.fail("size", "is not {\"shortest_edge\": S}, {\"height\": H, \"width\": W} or a number");
      }
    } else {  // the class default (ViT and DeiT squash, the others resize the shortest edge)
      t.resize = defaults->square ? ResizeRule::Exact : ResizeRule::ShortestEdge;
      t.resize_short = t.resize_w = t.resize_h = defaults->size;
    }
    need("resample");
    const json& code = r.has("resample") ? j.at("resample") : json(defaults->resample);
    if (!code.is_number_integer()) r.fail("resample", "is not an integer (PIL.Image.Resampling)");
    t.filter = pil_resample(code.get<int>(), r);
    if (t.engine == ResampleEngine::TorchAntialias && t.filter != ResampleFilter::Bilinear &&
        t.filter != ResampleFilter::Bicubic)
      r.fail("resample", std::string("is ") + resample_filter_name(t.filter) +
                             ", which the torchvision backend computes differently from torch's antialiased "
                             "bilinear and bicubic; vitlens reproduces only those there");
  }
  need("do_center_crop");
  t.center_crop = r.boolean("do_center_crop", defaults ? defaults->center_crop : false);
  if (t.center_crop) {
    int crop_h = 224, crop_w = 224;  // the classes' default crop_size
    if (r.has("crop_size")) {
      const json& c = j.at("crop_size");
      if (c.is_number_integer()) {
        crop_h = crop_w = r.side(c, "crop_size");
      } else if (c.is_object() && c.contains("height") && c.contains("width")) {
        crop_h = r.side(c.at("height"), "crop_size.height");
        crop_w = r.side(c.at("width"), "crop_size.width");
      } else {
        r.fail("crop_size", "is not {\"height\": H, \"width\": W}");
      }
    }
    t.crop_h = crop_h;
    t.crop_w = crop_w;
    t.crop_rounding = CropRounding::FloorHalf;  // (h - crop) // 2 in both backends
  }
  const bool rescale = r.boolean("do_rescale", true);
  t.rescale_factor = rescale ? r.number("rescale_factor", 1.0 / 255.0) : 1.0;
  if (!(t.rescale_factor > 0.0 && std::isfinite(t.rescale_factor))) r.fail("rescale_factor", "is not > 0");
  // DINOv3's processor rescales before it resizes (its _preprocess: rescale, resize, crop,
  // normalise), so torch resizes a float tensor; it has only the torchvision backend.
  if (type == "DINOv3ViTImageProcessor" && t.engine != ResampleEngine::TorchAntialias)
    r.fail("image_processor_type", "names a PIL backend for DINOv3ViTImageProcessor, which has only the torchvision one");
  if (type == "DINOv3ViTImageProcessor" && rescale) {
    if (t.resize != ResizeRule::None && t.filter != ResampleFilter::Bilinear)
      r.fail("resample", std::string("is ") + resample_filter_name(t.filter) +
                             "; DINOv3ViTImageProcessor resizes the rescaled float image, which vitlens reproduces "
                             "for bilinear (2) only");
    t.rescale_first = true;
  }
  t.normalize = r.boolean("do_normalize", true);
  if (t.normalize) {
    need("image_mean");
    need("image_std");
    t.mean = r.triple("image_mean", defaults ? defaults->mean : kHalf, false);
    t.std = r.triple("image_std", defaults ? defaults->std : kHalf, true);
  }
  return t;
}

}  // namespace

ImageTransform read_model_transform(const std::string& model_path, const std::string& format) {
  const std::string folder = parent_dir(model_path);
  if (format == "timm") {
    const std::string config = folder + "/config.json";
    if (!is_file(config)) return {};
    const json cfg = read_json_file(config);
    if (!cfg.contains("pretrained_cfg") || !cfg.at("pretrained_cfg").is_object()) return {};
    return timm_transform(cfg.at("pretrained_cfg"), config);
  }
  if (format.compare(0, 3, "hf-") == 0) {
    const std::string config = folder + "/preprocessor_config.json";
    if (!is_file(config)) return {};
    return hf_transform(read_json_file(config), config);
  }
  return {};
}

std::string missing_transform_reason(const std::string& format) {
  if (format == "timm") return "publishes no transform (no config.json with a pretrained_cfg beside it)";
  if (format.compare(0, 3, "hf-") == 0) return "publishes no transform (no preprocessor_config.json beside it)";
  return "publishes no transform (a " + format + " model: only timm and Hugging Face checkpoints carry one)";
}

PositionResize library_position_resize(const std::string& format, const std::string& folder) {
  if (format == "timm") return PositionResize::BicubicAntialias;  // resample_abs_pos_embed(antialias=True)
  if (format == "hf-dinov2" && is_file(folder + "/config.json")) {
    const json cfg = read_json_file(folder + "/config.json");
    if (cfg.contains("model_type") && cfg.at("model_type") == "dinov2_with_registers")
      return PositionResize::BicubicAntialias;  // Dinov2WithRegistersEmbeddings.interpolate_pos_encoding
  }
  return PositionResize::Bicubic;
}

}  // namespace vitlens
