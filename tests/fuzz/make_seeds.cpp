// vitlens_fuzz_seeds OUTDIR: writes the fuzzers' seed corpus (committed as tests/fuzz/corpus/) from
// vitlens' own code, a few KB per harness:
//   OUTDIR/model/   two tiny models save_model writes (one with a class token, qkv bias and one
//                   block; one without either, two blocks, a classifier head and head descriptions),
//                   and the first with a damaged header, each refused: a header length 4 bytes
//                   too long over NUL padding or over the data, a tensor and a metadata key given
//                   twice, a gap between tensors, bytes after the last tensor, a name of 64 KB
//   OUTDIR/image/   crops of the demo image, encoded by OpenCV in the formats vitlens reads most
//                   (PNG 8-bit RGB, gray, 16-bit with alpha; JPEG; BMP), sizes that pad and resize
//   OUTDIR/script/  viewer scripts using every command
//   OUTDIR/checkpoint/  a classifier's and an MAE encoder's training checkpoint, each as
//                   fuzz_checkpoint reads it: the model file's length (4 bytes, little-endian), the
//                   model file, the optimizer state file
//   OUTDIR/idx/     IDX image and label files in fuzz_idx's framing: plain, gzip'd, two gzip
//                   members, and the first images of Debian's Fashion-MNIST test set
//   OUTDIR/folder/  fuzz_folder's tree-building programs: self-links, a link to /, a loop through
//                   a parent link, links out of the data folder, a pipe, a broken link
// Seeds only need to be valid inputs that reach deep into each parser; the fuzzers mutate them.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iterator>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <zlib.h>

#include "../test_support.hpp"
#include "models/bundled.hpp"
#include "core/train/classify_objective.hpp"
#include "core/train/mae_objective.hpp"
#include "models/training_checkpoint.hpp"
#include "core/data/dataset.hpp"
#include "core/base/error.hpp"
#include "core/io/files.hpp"  // read_whole_file
#include "core/io/image.hpp"
#include "models/model_io.hpp"
#include "models/safetensors.hpp"

namespace {

using namespace vitlens;

std::string le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// `valid` (a model's safetensors bytes) with its header damaged in the ways the reader refuses.
void write_damaged_models(const std::string& dir, const std::string& valid) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(valid[static_cast<size_t>(i)]);
  const std::string header = valid.substr(8, n), data = valid.substr(8 + n);
  const nlohmann::json h = nlohmann::json::parse(header);
  const std::string text = h.dump();
  const std::string first = std::next(h.begin()).key();  // a tensor: sorted, "__metadata__" comes first
  const std::string entry = "\"" + first + "\":" + h[first].dump() + ",";
  nlohmann::json gap = h;
  for (auto& [name, value] : gap.items())
    if (name != "__metadata__") value["data_offsets"] = {value["data_offsets"][0].get<uint64_t>() + 4, value["data_offsets"][1].get<uint64_t>() + 4};
  nlohmann::json long_name = h;
  long_name[std::string(65536, 'n')] = long_name[first];
  long_name.erase(first);
  const std::vector<std::pair<std::string, std::string>> damaged = {
      {"nul-padding", le64(n + 4) + header + std::string(4, '\0') + data},
      {"length-plus-4", le64(n + 4) + header + data},
      {"tensor-twice", le64(text.size() + entry.size()) + "{" + entry + text.substr(1) + data},
      {"metadata-key-twice", [&] {
         std::string t = text;
         t.insert(t.find("\"__metadata__\":{") + 16, "\"config\":\"{}\",");
         return le64(t.size()) + t + data;
       }()},
      {"gap", le64(gap.dump().size()) + gap.dump() + std::string(4, '\0') + data},
      {"trailing-bytes", valid + std::string(4, '\0')},
      {"long-name", le64(long_name.dump().size()) + long_name.dump() + data},
  };
  for (const auto& [name, bytes] : damaged) write_file_atomic(dir + "/damaged-" + name + ".safetensors", bytes);
}

void write_models(const std::string& dir) {
  // P = 2, D = 4, 2 heads, 4 x 4 pixels: 5 tokens, about 1 KB of weights
  VitConfig a = test::vit_config("fuzz-seed-a", 2, 4, 2, 1, 4);
  a.description = "tiny seed for fuzz_model";
  save_model(dir + "/tiny-cls.safetensors", a, gaussian_tensors(a, 1));

  VitConfig b = a;
  b.name = "fuzz-seed-b";
  b.class_token = false;
  b.qkv_bias = false;
  b.depth = 2;
  b.img_h = 2;  // a 1 x 2 grid
  b.mlp_ratio = 1.5;
  b.head_descriptions = {{"first", "second"}, {"third", "fourth"}};
  TensorMap tb = gaussian_tensors(b, 2);
  TensorData head_w, head_b;  // a 3-class classifier head
  head_w.shape = {3, b.embed_dim};
  head_w.values.assign(12, 0.25f);
  head_b.shape = {3};
  head_b.values = {0.0f, 1.0f, -1.0f};
  tb.emplace("head.weight", head_w);
  tb.emplace("head.bias", head_b);
  save_model(dir + "/tiny-nocls-head.safetensors", b, tb);
  write_damaged_models(dir, safetensors_bytes([&] {
                         SafetensorsFile file;
                         file.tensors = gaussian_tensors(a, 1);
                         file.metadata["config"] = config_to_json(a).dump();
                         return file;
                       }()));
}

void write_image(const std::string& path, const cv::Mat& bgr, const std::vector<int>& params = {}) {
  std::vector<unsigned char> bytes;
  if (!cv::imencode(path.substr(path.find_last_of('.')), bgr, bytes, params)) throw Error(path + ": encoding failed");
  write_file_atomic(path, std::string(bytes.begin(), bytes.end()));
}

void write_images(const std::string& dir) {
  cv::Mat demo_bgr;
  cv::cvtColor(make_demo_image().rgb, demo_bgr, cv::COLOR_RGB2BGR);  // CV_8UC3, 224 x 224
  const cv::Mat crop = demo_bgr(cv::Rect(96, 96, 9, 13)).clone();    // 9 x 13: pads to 3 x 4 patches
  write_image(dir + "/rgb-9x13.png", crop);
  cv::Mat gray;
  cv::cvtColor(crop, gray, cv::COLOR_BGR2GRAY);
  write_image(dir + "/gray-9x13.png", gray);
  cv::Mat bgra16;
  cv::cvtColor(demo_bgr(cv::Rect(40, 40, 6, 5)), bgra16, cv::COLOR_BGR2BGRA);
  bgra16.convertTo(bgra16, CV_16U, 257.0);
  write_image(dir + "/rgba16-6x5.png", bgra16);
  write_image(dir + "/rgb-8x8.jpg", demo_bgr(cv::Rect(0, 0, 8, 8)).clone(), {cv::IMWRITE_JPEG_QUALITY, 80});
  write_image(dir + "/rgb-5x4.bmp", demo_bgr(cv::Rect(120, 30, 5, 4)).clone());
  cv::Mat wide;  // 300 x 8: longer than 224, so prepare_image downscales it
  cv::resize(demo_bgr(cv::Rect(0, 100, 224, 8)), wide, cv::Size(300, 8), 0, 0, cv::INTER_NEAREST);
  write_image(dir + "/rgb-300x8.png", wide, {cv::IMWRITE_PNG_COMPRESSION, 9});
}

void write_scripts(const std::string& dir) {
  const std::vector<std::pair<std::string, std::string>> scripts = {
      {"files.txt", "open images/a photo.png\nmodel models/x.safetensors\nexport out dir raw\nexport out\n"
                    "screenshot shot.png\nstate state.json   # trailing comment\n"},
      {"view.txt", "pin 10 12\nkey right\nkey up\nhover 3 4\nmode query\nmode received\nmode cls\nlayer 0\n"
                   "colormap inferno\nalpha 0.5\nnormalize log\nupsample bilinear\nthreshold 0.6\nthreshold off\n"
                   "grid on\n"},
      {"mask.txt", "mask painted\npaint 1 2\nerase 1 2\nclear-paint\nmask causal\nscale temperature 0.5\n"
                   "scale none\nsize 128\nsize default\n"},
      {"panels.txt", "# panels and the worked example\nshow stats on\nshow example off\nexample q 1 0 -0.25\n"
                     "example scaled off\nexample reset\nbrowse model\nframes 3\nquit\n"},
  };
  for (const auto& [name, text] : scripts) write_file_atomic(dir + "/" + name, text);
}

// One checkpoint saved by `save` into a scratch folder, packed as fuzz_checkpoint's input.
void write_checkpoint_seed(const std::string& path, const std::function<void(const std::string&)>& save) {
  std::string scratch = (std::filesystem::temp_directory_path() / "vitlens-seeds-XXXXXX").string();
  if (!::mkdtemp(scratch.data())) throw Error(scratch + ": cannot create a scratch folder");
  const std::string model_path = scratch + "/last.safetensors";
  save(model_path);
  const std::string model = read_whole_file(model_path, "model", kMaxModelFileBytes);
  const std::string state = read_whole_file(checkpoint_state_path(model_path), "state", kMaxModelFileBytes);
  std::filesystem::remove_all(scratch);
  std::string packed;
  for (int i = 0; i < 4; ++i) packed.push_back(static_cast<char>((model.size() >> (8 * i)) & 0xff));
  write_file_atomic(path, packed + model + state);
}

void write_checkpoints(const std::string& dir) {
  // P = 2, D = 4, 2 heads, 4 x 4 pixels: a few hundred parameters
  const VitConfig c = test::vit_config("fuzz-seed-ckpt", 2, 4, 2, 1, 4);
  Recipe recipe;
  recipe.batch = 2;
  recipe.epochs = 3;
  recipe.threads = 1;

  ImageSet images;  // 6 images of 3 classes: 3 steps per epoch
  images.height = images.width = 4;
  images.class_names = {"a", "b", "c"};
  images.source = "seed";
  for (int i = 0; i < 6; ++i) images.labels.push_back(i % 3);
  images.pixels.resize(6 * 3 * 16);
  for (size_t i = 0; i < images.pixels.size(); ++i) images.pixels[i] = static_cast<float>(i % 7) / 7.0f;
  Trainer classifier(std::make_unique<ClassifyObjective>(c, recipe, &images, nullptr));
  for (int i = 0; i < 4; ++i) classifier.step();  // into the second epoch
  write_checkpoint_seed(dir + "/classifier.bin",
                        [&](const std::string& p) { save_checkpoint(classifier, p, {{"data", "seed"}}); });

  PhotoCorpus photos;  // 3 photos of 6 x 6, 2 crops each: 3 steps per epoch
  for (int i = 0; i < 3; ++i) {
    photos.photos.emplace_back(3 * 36, 0.2f + 0.3f * static_cast<float>(i));
    photos.heights.push_back(6);
    photos.widths.push_back(6);
    photos.names.push_back("photo" + std::to_string(i) + ".png");
  }
  photos.source = "seed";
  MaeOptions options;
  options.shape.decoder_dim = 4;
  options.shape.decoder_depth = 1;
  options.shape.decoder_heads = 2;
  options.crops_per_photo = 2;
  Trainer mae(std::make_unique<MaeObjective>(c, recipe, options, &photos, nullptr));
  for (int i = 0; i < 2; ++i) mae.step();
  write_checkpoint_seed(dir + "/mae.bin", [&](const std::string& p) { save_checkpoint(mae, p, {{"data", "photos"}}); });
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string idx(const std::vector<uint32_t>& dims, const std::string& data) {
  std::string b = be32(0x800u + static_cast<uint32_t>(dims.size()));
  for (uint32_t d : dims) b += be32(d);
  return b + data;
}

std::string gzip(const std::string& raw) {
  z_stream zs{};
  if (deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) throw Error("gzip: deflateInit2 failed");
  std::string out(deflateBound(&zs, static_cast<uLong>(raw.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = reinterpret_cast<Bytef*>(&out[0]);
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  if (rc != Z_STREAM_END) throw Error("gzip: deflate failed");
  return out;
}

// fuzz_idx's framing: flags (bit 0: images named .gz, bit 1: labels), images length (16-bit LE), images, labels.
std::string idx_input(int flags, const std::string& images, const std::string& labels) {
  if (images.size() > 0xffff) throw Error("idx seed: images part too long");
  std::string b(1, static_cast<char>(flags));
  b += static_cast<char>(images.size() & 0xff);
  b += static_cast<char>(images.size() >> 8);
  return b + images + labels;
}

void write_idx(const std::string& dir) {
  const std::string images = idx({3, 2, 2}, std::string("\x00\x01\x02\x03\x0a\x0b\x0c\x0d\x14\x15\x16\xff", 12));
  const std::string labels = idx({3}, std::string("\x04\x00\x09", 3));
  write_file_atomic(dir + "/tiny-plain", idx_input(0, images, labels));
  write_file_atomic(dir + "/tiny-gzip", idx_input(3, gzip(images), gzip(labels)));
  write_file_atomic(dir + "/tiny-two-members", idx_input(1, gzip(images.substr(0, 9)) + gzip(images.substr(9)), labels));
  // The first 3 images of the real test set, as 28 x 28 bytes.
  const ImageSet real = load_fashion_mnist(default_fashion_mnist_dir(), false, 3);
  std::string pixels, classes;
  for (int i = 0; i < real.size(); ++i) {
    for (int k = 0; k < 28 * 28; ++k) pixels += static_cast<char>(std::lround(real.image(i)[k] * 255.0f));
    classes += static_cast<char>(real.labels[static_cast<size_t>(i)]);
  }
  write_file_atomic(dir + "/fashion-3-gzip", idx_input(1, gzip(idx({3, 28, 28}, pixels)), idx({3}, classes)));
}

// fuzz_folder's programs: (what, argument[, more]) steps; fuzz_folder.cpp says how they are read.
void write_folders(const std::string& dir) {
  const std::vector<std::pair<std::string, std::vector<unsigned char>>> programs = {
      // mkdir a; a/1.png; a/l -> .; a/sub -> .
      {"two-self-links", {0, 0, 1, 1, 3, 41, 1, 0, 3, 33, 1, 0}},
      // mkdir a; a/1.png; a/l -> /
      {"link-to-root", {0, 0, 1, 1, 3, 41, 1, 3}},
      // mkdir a; mkdir a/sub; a/sub/1.png; a/sub/l -> ..; a/sub/c -> ../..
      {"parent-loop", {0, 0, 0, 33, 1, 2, 3, 41, 1, 1, 3, 17, 1, 2}},
      // mkdir a; a/1.png; a/l -> the outside folder; a/3.png -> the outside file
      {"links-outside", {0, 0, 1, 1, 3, 41, 1, 4, 3, 33, 0, 5}},
      // mkdir a; mkdir b; a/1.png; a pipe 2.jpg; a broken link a/l; b/1.png of junk; 3.png -> a/1.png
      {"odd-entries", {0, 0, 0, 8, 1, 1, 5, 9, 3, 25, 0, 6, 2, 2, 8, 'n', 'o', 't', ' ', 'p', 'n', 'g', '!', 3, 36, 0, 200}},
  };
  for (const auto& [name, bytes] : programs) write_file_atomic(dir + "/" + name, std::string(bytes.begin(), bytes.end()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: vitlens_fuzz_seeds OUTDIR   (e.g. the source tree's tests/fuzz/corpus)\n";
    return 2;
  }
  const std::string out = argv[1];
  try {
    for (const char* sub : {"/model", "/image", "/script", "/checkpoint", "/idx", "/folder"}) {
      std::error_code ec;
      std::filesystem::create_directories(out + sub, ec);
      if (ec) throw Error(out + sub + ": cannot create the folder (" + ec.message() + ")");
    }
    write_models(out + "/model");
    write_images(out + "/image");
    write_scripts(out + "/script");
    write_checkpoints(out + "/checkpoint");
    write_idx(out + "/idx");
    write_folders(out + "/folder");
  } catch (const Error& e) {
    std::cerr << "vitlens_fuzz_seeds: " << e.what() << "\n";
    return 1;
  }
  std::cout << "wrote the seed corpus into " << out << "/{model,image,script,checkpoint,idx,folder}\n";
  return 0;
}
