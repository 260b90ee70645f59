// `--preprocess model` against the libraries' own pipelines, and positional tables resized as the
// libraries resize them. The references come from tests/fixtures/make_preprocess_fixtures.py
// (timm create_transform, transformers AutoImageProcessor with both backends, the libraries'
// resample_abs_pos_embed / interpolate_pos_encoding) run on opencv-doc photos that are read at run
// time; a test whose photo is absent says so and checks nothing else.
#include <catch2/catch.hpp>

#include <climits>
#include <cstdio>
#include <fstream>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/io/preprocess.hpp"
#include "core/model/vit.hpp"
#include "models/model_io.hpp"
#include "models/model_transform.hpp"
#include "npy_support.hpp"
#include "test_support.hpp"

namespace {

const std::string kDir = std::string(VITLENS_TEST_FIXTURES) + "/preprocess/";
const std::string kForeignDir = std::string(VITLENS_TEST_FIXTURES) + "/foreign/";

nlohmann::json manifest() { return nlohmann::json::parse(npy_file_bytes(kDir + "manifest.json")); }

bool have_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The photo's path, or "" after saying why the case is skipped.
std::string photo_or_skip(const nlohmann::json& m, const nlohmann::json& c) {
  const std::string path = m.at("photos").get<std::string>() + "/" + c.at("photo").get<std::string>();
  if (have_file(path)) return path;
  std::printf("SKIPPED %s: the photo %s is absent (install opencv-doc: scripts/setup.sh)\n",
              c.at("name").get<std::string>().c_str(), path.c_str());
  return "";
}

// FNV-1a 64 over the bytes, as the fixture script hashes the library's 8-bit image.
std::string fnv1a64(const cv::Mat& rgb8) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (int y = 0; y < rgb8.rows; ++y) {
    const uint8_t* row = rgb8.ptr<uint8_t>(y);
    for (int i = 0; i < rgb8.cols * 3; ++i) h = (h ^ row[i]) * 0x100000001B3ull;
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

std::string format_of(const nlohmann::json& c) {
  return c.at("library").get<std::string>() == "timm" ? "timm" : "hf-vit";
}

void copy_file(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  REQUIRE(in);
  std::ofstream out(to, std::ios::binary);
  out << in.rdbuf();
}

}  // namespace

TEST_CASE("model preprocessing gives the pixels of timm's and transformers' pipelines on photos", "[preprocess]") {
  const nlohmann::json m = manifest();
  const double tolerance = m.at("tolerance_pixels").get<double>();
  REQUIRE(m.at("pixels").size() == 12);  // the script writes twelve; fewer means stale fixtures
  for (const auto& c : m.at("pixels")) {
    const std::string name = c.at("name").get<std::string>();
    SECTION(name) {
      const std::string photo = photo_or_skip(m, c);
      if (photo.empty()) return;
      INFO(name << ": " << c.at("pipeline").get<std::string>());
      const vitlens::ImageTransform t =
          vitlens::read_model_transform(kDir + name + "/model.safetensors", format_of(c));
      REQUIRE(t.present());
      if (c.contains("backend"))
        CHECK(t.engine == (c.at("backend") == "pil" ? vitlens::ResampleEngine::Pillow
                                                    : vitlens::ResampleEngine::TorchAntialias));
      const vitlens::LoadedImage image = vitlens::load_image(photo);
      cv::Mat rgb8;
      image.rgb01.convertTo(rgb8, CV_8UC3, 255.0);
      const cv::Mat out8 = vitlens::apply_transform_rgb8(rgb8, t, name);
      REQUIRE(out8.cols == c.at("width").get<int>());
      REQUIRE(out8.rows == c.at("height").get<int>());
      CHECK(fnv1a64(out8) == c.at("fnv1a64").get<std::string>());  // every byte

      // The model's input, through patchify: (x * rescale - mean) / std at every 7th pixel.
      vitlens::VitConfig config;
      config.patch_size = 16;
      config.img_w = config.img_h = 224;
      const vitlens::PreparedImage prepared = vitlens::prepare_image_transformed(image, config, t, name);
      REQUIRE(prepared.grid.grid_w * 16 == out8.cols);
      const NpyArray samples = read_npy(kDir + name + "/" + c.at("samples").get<std::string>());  // (3, h, w)
      const int step = c.at("step").get<int>();
      const int sh = static_cast<int>(samples.shape[1]), sw = static_cast<int>(samples.shape[2]);
      double worst = 0.0;
      for (int ch = 0; ch < 3; ++ch)
        for (int sy = 0; sy < sh; ++sy)
          for (int sx = 0; sx < sw; ++sx) {
            const int y = sy * step, x = sx * step;
            const float got = prepared.grid.patches((y / 16) * prepared.grid.grid_w + x / 16,
                                                    ch * 256 + (y % 16) * 16 + x % 16);
            const float want = samples.values[(static_cast<size_t>(ch) * sh + sy) * sw + sx];
            worst = std::max(worst, static_cast<double>(std::abs(got - want)));
          }
      CHECK(worst <= tolerance);
      WARN(name << " [" << t.describe() << "]: bytes " << (fnv1a64(out8) == c.at("fnv1a64") ? "equal" : "DIFFER")
                << ", max |diff| pixels " << worst);
    }
  }
}

TEST_CASE("model preprocessing gives the libraries' attention maps on photos", "[preprocess][parity]") {
  const nlohmann::json m = manifest();
  const double tolerance = m.at("tolerance_probs").get<double>();
  REQUIRE(m.at("maps").size() == 6);
  for (const auto& c : m.at("maps")) {
    const std::string name = c.at("name").get<std::string>();
    SECTION(name) {
      const std::string photo = photo_or_skip(m, c);
      if (photo.empty()) return;
      INFO(name << ": " << c.at("pipeline").get<std::string>());
      const std::string foreign = kForeignDir + c.at("model").get<std::string>();
      std::string model_path = foreign + "/model.safetensors";
      std::string tmp;
      if (c.contains("config")) {  // a Hugging Face model with the case's preprocessor_config.json beside it
        tmp = vitlens::test::temp_dir("preprocess");
        copy_file(foreign + "/model.safetensors", tmp + "/model.safetensors");
        copy_file(foreign + "/config.json", tmp + "/config.json");
        copy_file(kDir + name + "/preprocessor_config.json", tmp + "/preprocessor_config.json");
        model_path = tmp + "/model.safetensors";
      }
      const vitlens::VitModel model = vitlens::load_model(model_path);
      const vitlens::ImageTransform t = vitlens::read_model_transform(model_path, model.format);
      REQUIRE(t.present());
      const vitlens::PreparedImage image =
          vitlens::prepare_image_transformed(vitlens::load_image(photo), model.config, t, name);
      vitlens::ForwardOptions options;
      options.keep_probs = true;
      const vitlens::ForwardResult result = vitlens::forward(model, image.grid, options);
      const NpyArray probs = read_npy(kDir + name + "/" + c.at("probs").get<std::string>());  // (L, H, N, N)
      const int L = model.config.depth, H = model.config.num_heads, N = result.tokens;
      REQUIRE(probs.shape == std::vector<int64_t>{L, H, N, N});
      double worst = 0.0;
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          worst = std::max(worst, max_abs_diff(result.layers[static_cast<size_t>(l)].probs[static_cast<size_t>(h)].data(),
                                               probs.values.data() + (static_cast<size_t>(l) * H + h) * N * N,
                                               static_cast<size_t>(N) * N));
      CHECK(worst <= tolerance);
      WARN(name << " [" << t.library << "]: max |diff| probs " << worst);
      if (!tmp.empty())
        for (const char* f : {"/model.safetensors", "/config.json", "/preprocessor_config.json", ""})
          std::remove((tmp + f).c_str());
    }
  }
}

TEST_CASE("positional tables resize as each family's library resizes them", "[preprocess][pos]") {
  const nlohmann::json m = manifest();
  REQUIRE(m.at("positions").size() == 42);
  for (const auto& c : m.at("positions")) {
    const std::string model_name = c.at("model").get<std::string>();
    const int gh = c.at("grid")[0].get<int>(), gw = c.at("grid")[1].get<int>();
    INFO(model_name << " at " << gh << "x" << gw << " (" << c.at("library").get<std::string>() << ")");
    const vitlens::VitModel model = vitlens::load_model(kForeignDir + model_name + "/model.safetensors");
    const bool antialias = model_name.rfind("timm_", 0) == 0 || model_name == "hf_dinov2_reg";
    CHECK(model.position_resize ==
          (antialias ? vitlens::PositionResize::BicubicAntialias : vitlens::PositionResize::Bicubic));
    const vitlens::MatRM table = vitlens::positional_table(model, gh, gw);
    const NpyArray want = read_npy(kDir + c.at("file").get<std::string>());  // (gh*gw, D)
    REQUIRE(want.shape == std::vector<int64_t>{gh * gw, model.config.embed_dim});
    const vitlens::MatRM patches = table.bottomRows(gh * gw);
    const double diff = max_abs_diff(patches.data(), want.values.data(), want.values.size());
    CHECK(diff <= 1e-5);
  }
}

TEST_CASE("model transforms vitlens cannot reproduce are refused naming the key", "[preprocess]") {
  const std::string dir = vitlens::test::temp_dir("transform");
  auto refused = [&](const std::string& file, const std::string& text, const std::string& format) {
    std::ofstream(dir + "/" + file) << text;
    std::string message;
    try {
      vitlens::read_model_transform(dir + "/model.safetensors", format);
    } catch (const vitlens::Error& e) {
      message = e.what();
    }
    std::remove((dir + "/" + file).c_str());
    return message;
  };
  CHECK_THAT(refused("config.json", R"({"pretrained_cfg": {"input_size": [3, 224, 224], "crop_mode": "border"}})", "timm"),
             Catch::Contains("'crop_mode'") && Catch::Contains("border"));
  CHECK_THAT(refused("config.json", R"({"pretrained_cfg": {"input_size": [3, 224, 224], "crop_pct": 1.2}})", "timm"),
             Catch::Contains("'crop_pct'"));
  CHECK_THAT(refused("preprocessor_config.json", R"({"image_processor_type": "ViTImageProcessor", "resample": 0})", "hf-vit"),
             Catch::Contains("'resample'") && Catch::Contains("nearest"));
  CHECK_THAT(refused("preprocessor_config.json", R"({"image_processor_type": "ViTImageProcessor", "resample": 1})", "hf-vit"),
             Catch::Contains("torchvision backend"));
  CHECK_THAT(refused("preprocessor_config.json", R"({"size": {"shortest_edge": 224, "longest_edge": 1333}})", "hf-vit"),
             Catch::Contains("longest_edge"));
  // A vitlens model and a timm file without config.json carry no transform.
  CHECK_FALSE(vitlens::read_model_transform(dir + "/model.safetensors", "vitlens").present());
  CHECK_FALSE(vitlens::read_model_transform(dir + "/model.safetensors", "timm").present());
  ::rmdir(dir.c_str());
}

TEST_CASE("a model transform's sizes are bounded: a damaged crop_pct or size is one line before any pixel",
          "[preprocess]") {
  const std::string dir = vitlens::test::temp_dir("transform-bounds");
  auto read = [&](const std::string& file, const std::string& text, const std::string& format) {
    std::ofstream(dir + "/" + file) << text;
    const vitlens::ImageTransform t = vitlens::read_model_transform(dir + "/model.safetensors", format);
    std::remove((dir + "/" + file).c_str());
    return t;
  };
  auto refused = [&](const std::string& file, const std::string& text, const std::string& format) {
    std::string message;
    try {
      read(file, text, format);
    } catch (const vitlens::Error& e) {
      message = e.what();
    }
    return message;
  };
  auto timm = [](const std::string& input_size, const std::string& crop_pct) {
    return R"({"pretrained_cfg": {"input_size": [3, )" + input_size + "], \"crop_pct\": " + crop_pct + "}}";
  };
  // Resizes to -2^31, 3.2 million and 64000 px a side: refused as the config is read.
  for (const char* pct : {"1e-9", "0.00001", "0.0005", "0.3"}) {
    INFO("crop_pct " << pct);
    const std::string m = refused("config.json", timm("32, 32", pct), "timm");
    CHECK_THAT(m, Catch::Contains("config.json pretrained_cfg: 'crop_pct' is ") && Catch::Contains("not in [0.5, 1]"));
    CHECK(m.find('\n') == std::string::npos);
  }
  // Half is the least kept; a resize over the largest side a model has is refused naming both keys.
  CHECK(read("config.json", timm("32, 32", "0.5"), "timm").resize_short == 64);
  CHECK_THAT(refused("config.json", timm("16384, 16384", "0.875"), "timm"),
             Catch::Contains("'crop_pct' is 0.875, which with input_size 16384x16384 resizes to 18724 px a side"));

  // Sizes that depend on the image are refused when it is known, before the resize allocates.
  const cv::Mat rgb8(8, 2048, CV_8UC3, cv::Scalar(1, 2, 3));
  auto apply_refused = [&](const vitlens::ImageTransform& t) {
    std::string message;
    try {
      vitlens::apply_transform_rgb8(rgb8, t, "strip.png");
    } catch (const vitlens::Error& e) {
      message = e.what();
    }
    return message;
  };
  const vitlens::ImageTransform exact =
      read("preprocessor_config.json",
           R"({"image_processor_type": "ViTImageProcessor", "size": {"height": 16384, "width": 16384}})", "hf-vit");
  CHECK_THAT(apply_refused(exact), Catch::Contains("strip.png: the model's transform (" + dir +
                                                   "/preprocessor_config.json) resizes it to 16384x16384 (268 megapixels)"));
  // The shortest edge of an 8 px strip to 448: 114688x448.
  const vitlens::ImageTransform shortest =
      read("preprocessor_config.json",
           R"({"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 448}, "crop_size": 448})", "hf-vit");
  CHECK_THAT(apply_refused(shortest), Catch::Contains("resizes the shortest edge of this 2048x8 image to 448, giving "
                                                      "114688x448 (51 megapixels), more than vitlens resizes an image to (45)"));
  // At 224 (57344x224, 13 megapixels) it is done, as the library does it.
  const vitlens::ImageTransform small =
      read("preprocessor_config.json", R"({"image_processor_type": "CLIPImageProcessor"})", "hf-vit");
  CHECK(vitlens::apply_transform_rgb8(rgb8, small, "strip.png").size() == cv::Size(224, 224));
  // Without a crop, 57344x224 is worked on at 2048x8: thinner than a 16 px patch, and --size,
  // which the whole-image mode's refusal advises, does not apply.
  const vitlens::ImageTransform uncropped =
      read("preprocessor_config.json",
           R"({"image_processor_type": "CLIPImageProcessor", "do_center_crop": false})", "hf-vit");
  vitlens::VitConfig c16 = vitlens::test::small_config(32);
  c16.patch_size = 16;
  cv::Mat rgb01;
  rgb8.convertTo(rgb01, CV_32FC3, 1.0 / 255.0);
  std::string thin;
  try {
    vitlens::prepare_image_transformed(vitlens::LoadedImage{rgb01, 2048, 8}, c16, uncropped, "strip.png");
  } catch (const vitlens::Error& e) {
    thin = e.what();
  }
  CHECK_THAT(thin, Catch::Contains("gives a 57344x224 image, thinner than one 16x16 patch at the 2048 px a side") &&
                       !Catch::Contains("--size"));
  // A long side past what an int holds saturates instead of overflowing.
  vitlens::ImageTransform huge;
  huge.resize = vitlens::ResizeRule::ShortestEdge;
  huge.resize_short = 16384;
  CHECK(vitlens::transform_resized_size(huge, 1, 1 << 20) == cv::Size(16384, INT_MAX));
  ::rmdir(dir.c_str());
}

namespace {

const std::string kTransformDir = std::string(VITLENS_TEST_FIXTURES) + "/transform/";

cv::Mat load_rgb8(const std::string& path) {
  cv::Mat rgb8;
  vitlens::load_image(path).rgb01.convertTo(rgb8, CV_8UC3, 255.0);
  return rgb8;
}

vitlens::ResampleFilter filter_named(const std::string& name) {
  if (name == "bicubic") return vitlens::ResampleFilter::Bicubic;
  if (name == "bilinear") return vitlens::ResampleFilter::Bilinear;
  if (name == "lanczos") return vitlens::ResampleFilter::Lanczos;
  if (name == "box") return vitlens::ResampleFilter::Box;
  if (name == "hamming") return vitlens::ResampleFilter::Hamming;
  FAIL("unknown filter " << name);
  return vitlens::ResampleFilter::Bicubic;
}

}  // namespace

TEST_CASE("Pillow resampling runs its two passes in Pillow's order", "[preprocess][resample]") {
  // Pillow rounds to 8 bits between the passes; Pillow 13 runs the vertical one first when the
  // height loses more than twice as many pixels as the width (make_transform_fixtures.py checks
  // that each case's bytes differ between the two orders).
  const nlohmann::json m = nlohmann::json::parse(npy_file_bytes(kTransformDir + "manifest.json"));
  const cv::Mat source = load_rgb8(kTransformDir + m.at("source").get<std::string>());
  REQUIRE(m.at("resample").size() == 10);
  for (const auto& c : m.at("resample")) {
    const std::string file = c.at("file").get<std::string>();
    SECTION(file) {
      INFO(file << " (" << c.at("order").get<std::string>() << ")");
      const cv::Mat want = load_rgb8(kTransformDir + file);
      const cv::Mat got = vitlens::resample_rgb8(source, c.at("width").get<int>(), c.at("height").get<int>(),
                                                 filter_named(c.at("filter").get<std::string>()),
                                                 vitlens::ResampleEngine::Pillow);
      REQUIRE(got.size() == want.size());
      CHECK(fnv1a64(got) == fnv1a64(want));  // every byte
    }
  }
}

TEST_CASE("older preprocessor_config.json files are read as transformers reads them", "[preprocess]") {
  // feature_extractor_type instead of image_processor_type, a plain number as size (S x S for ViT
  // and DeiT, shortest edge S for CLIP), keys left to the class's defaults.
  const nlohmann::json m = nlohmann::json::parse(npy_file_bytes(kTransformDir + "manifest.json"));
  REQUIRE(m.at("legacy").size() == 4);
  for (const auto& c : m.at("legacy")) {
    const std::string name = c.at("name").get<std::string>();
    SECTION(name) {
      const std::string folder = kTransformDir + "legacy/" + name;
      const vitlens::ImageTransform t = vitlens::read_model_transform(folder + "/model.safetensors", "hf-vit");
      INFO(name << ": " << t.describe());
      REQUIRE(t.present());
      CHECK(t.engine == vitlens::ResampleEngine::TorchAntialias);  // transformers' default backend
      CHECK_THAT(t.library, Catch::Contains(c.at("processor").get<std::string>()));
      const nlohmann::json& size = c.at("size");
      if (size.contains("shortest_edge")) {
        CHECK(t.resize == vitlens::ResizeRule::ShortestEdge);
        CHECK(t.resize_short == size.at("shortest_edge").get<int>());
      } else {
        CHECK(t.resize == vitlens::ResizeRule::Exact);
        CHECK(t.resize_w == size.at("width").get<int>());
        CHECK(t.resize_h == size.at("height").get<int>());
      }
      CHECK(t.center_crop == !c.at("crop").is_null());
      if (!c.at("crop").is_null()) {
        CHECK(t.crop_w == c.at("crop").at("width").get<int>());
        CHECK(t.crop_h == c.at("crop").at("height").get<int>());
      }
      const int resample = c.at("resample").get<int>();
      CHECK(t.filter == (resample == 2 ? vitlens::ResampleFilter::Bilinear : vitlens::ResampleFilter::Bicubic));
      for (int i = 0; i < 3; ++i) {
        CHECK(t.mean[static_cast<size_t>(i)] == Approx(c.at("mean")[static_cast<size_t>(i)].get<double>()).margin(1e-7));
        CHECK(t.std[static_cast<size_t>(i)] == Approx(c.at("std")[static_cast<size_t>(i)].get<double>()).margin(1e-7));
      }
    }
  }
  // A plain-number size of a processor vitlens does not know is refused, naming the key.
  const std::string dir = vitlens::test::temp_dir("legacy_transform");
  std::ofstream(dir + "/preprocessor_config.json")
      << R"({"feature_extractor_type": "ConvNextFeatureExtractor", "size": 224, "resample": 3})";
  std::string message;
  try {
    vitlens::read_model_transform(dir + "/model.safetensors", "hf-vit");
  } catch (const vitlens::Error& e) {
    message = e.what();
  }
  std::remove((dir + "/preprocessor_config.json").c_str());
  ::rmdir(dir.c_str());
  CHECK_THAT(message, Catch::Contains("'size'") && Catch::Contains("ConvNextImageProcessor"));
}

TEST_CASE("DINOv3's processor rescales to float before its antialiased bilinear resize", "[preprocess][resample]") {
  // transformers' DINOv3ViTImageProcessor: x * rescale_factor, then torch's antialiased bilinear
  // on the float tensor, then normalise (make_transform_fixtures.py checks each case differs from
  // the 8-bit path the other processors take, by more than 1e-4). Without normalisation the pixels
  // are torch's floats: equal to the bit at the photos' shrink factors (below 2: measured by
  // bench/family_parity.py), within 2 float ulps (2.5e-7) at these noise images' 2.5 to 3.75, where
  // torch's kernel rounds some samples differently from the sequential fused sum reproduced here.
  const nlohmann::json m = nlohmann::json::parse(npy_file_bytes(kTransformDir + "manifest.json"));
  REQUIRE(m.at("rescale_first").size() == 4);
  const vitlens::LoadedImage source = vitlens::load_image(kTransformDir + m.at("source").get<std::string>());
  for (const auto& c : m.at("rescale_first")) {
    const std::string name = c.at("name").get<std::string>();
    SECTION(name) {
      const vitlens::ImageTransform t =
          vitlens::read_model_transform(kTransformDir + c.at("folder").get<std::string>() + "/model.safetensors", "hf-dinov3");
      INFO(name << ": " << t.describe());
      REQUIRE(t.present());
      CHECK(t.rescale_first);
      CHECK(t.engine == vitlens::ResampleEngine::TorchAntialias);
      CHECK(t.filter == vitlens::ResampleFilter::Bilinear);
      CHECK_THAT(t.describe(), Catch::Contains("rescaled float"));
      const int w = c.at("width").get<int>(), h = c.at("height").get<int>();
      vitlens::VitConfig config;
      config.patch_size = 4;  // every case's sides are whole patches
      config.img_w = w;
      config.img_h = h;
      const vitlens::PreparedImage prepared = vitlens::prepare_image_transformed(source, config, t, name);
      REQUIRE(prepared.grid.grid_w * 4 == w);
      REQUIRE(prepared.grid.grid_h * 4 == h);
      const NpyArray want = read_npy(kTransformDir + c.at("pixels").get<std::string>());  // (3, h, w)
      REQUIRE(want.shape == std::vector<int64_t>{3, h, w});
      double worst = 0.0;
      int unequal = 0;
      for (int ch = 0; ch < 3; ++ch)
        for (int y = 0; y < h; ++y)
          for (int x = 0; x < w; ++x) {
            const float got = prepared.grid.patches((y / 4) * prepared.grid.grid_w + x / 4, ch * 16 + (y % 4) * 4 + x % 4);
            const float ref = want.values[(static_cast<size_t>(ch) * h + y) * w + x];
            worst = std::max(worst, static_cast<double>(std::abs(got - ref)));
            unequal += got != ref;
          }
      INFO("max |diff| " << worst << ", " << unequal << " values differ");
      if (c.at("normalize").get<bool>())
        CHECK(worst <= 1e-6);  // the normalisation's own rounding (x - mean) / std
      else
        CHECK(worst <= 2.5e-7);
      WARN(name << ": " << unequal << " of " << 3 * w * h << " values differ from torch's, max |diff| " << worst);
    }
  }
  // The 8-bit path on the same file is not these pixels: the order matters.
  const auto& first = m.at("rescale_first")[0];
  vitlens::ImageTransform t =
      vitlens::read_model_transform(kTransformDir + first.at("folder").get<std::string>() + "/model.safetensors", "hf-dinov3");
  t.rescale_first = false;
  vitlens::VitConfig config;
  config.patch_size = 4;
  config.img_w = config.img_h = 16;
  const vitlens::PreparedImage eight = vitlens::prepare_image_transformed(source, config, t, "8-bit");
  const NpyArray want = read_npy(kTransformDir + first.at("pixels").get<std::string>());
  double worst = 0.0;
  for (int ch = 0; ch < 3; ++ch)
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 16; ++x)
        worst = std::max(worst, static_cast<double>(std::abs(
                                    eight.grid.patches((y / 4) * 4 + x / 4, ch * 16 + (y % 4) * 4 + x % 4) -
                                    want.values[(static_cast<size_t>(ch) * 16 + y) * 16 + x])));
  CHECK(worst > 1e-4);
}

TEST_CASE("DINOv3's processor with another filter or a PIL backend is refused naming the key", "[preprocess]") {
  const std::string dir = vitlens::test::temp_dir("dinov3_transform");
  auto message_of = [&](const std::string& text) {
    std::ofstream(dir + "/preprocessor_config.json") << text;
    std::string message;
    try {
      vitlens::read_model_transform(dir + "/model.safetensors", "hf-dinov3");
    } catch (const vitlens::Error& e) {
      message = e.what();
    }
    std::remove((dir + "/preprocessor_config.json").c_str());
    return message;
  };
  CHECK_THAT(message_of(R"({"image_processor_type": "DINOv3ViTImageProcessorFast", "resample": 3})"),
             Catch::Contains("'resample'") && Catch::Contains("bilinear"));
  CHECK_THAT(message_of(R"({"image_processor_type": "DINOv3ViTImageProcessorPil"})"),
             Catch::Contains("'image_processor_type'") && Catch::Contains("torchvision"));
  // The published file (facebook/dinov3-*: the Fast class, every value the class's default).
  std::ofstream(dir + "/preprocessor_config.json") << R"({"image_processor_type": "DINOv3ViTImageProcessorFast"})";
  const vitlens::ImageTransform t = vitlens::read_model_transform(dir + "/model.safetensors", "hf-dinov3");
  std::remove((dir + "/preprocessor_config.json").c_str());
  ::rmdir(dir.c_str());
  CHECK(t.rescale_first);
  CHECK(t.resize == vitlens::ResizeRule::Exact);
  CHECK(t.resize_w == 224);
  CHECK(t.resize_h == 224);
  CHECK_FALSE(t.center_crop);
  CHECK(t.mean[0] == Approx(0.485));
}
