// The unlabelled photo corpus for masked patch prediction (MAE): every readable image under a
// folder, kept at its size (long side capped), and its crops (random, given, centred), resized
// to the model's input. Legend: S = crop side.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include <opencv2/imgproc.hpp>

#include "core/base/error.hpp"
#include "core/data/data_internal.hpp"
#include "core/data/dataset.hpp"
#include "core/io/image.hpp"

namespace vitlens {

namespace fs = std::filesystem;
using namespace data_internal;

int PhotoCorpus::size() const { return static_cast<int>(photos.size()); }

std::string default_photo_dir() { return "/usr/share/doc/opencv-doc/examples/data"; }

PhotoCorpus load_photo_corpus(const std::string& dir, int max_side, FolderReport* report) {
  if (max_side < 1) throw Error(dir + ": photo size cap must be >= 1 px, got " + std::to_string(max_side));
  require_folder(dir, "expected photos in it");
  PhotoCorpus corpus;
  corpus.source = dir;
  DataWalker walker(dir);
  const FolderWalk walk = walker.walk(dir, true);
  note_walk(report, walk);
  for (const std::string& file : walk.files) {
    cv::Mat rgb;
    try {
      rgb = load_image(file, max_side).rgb01;  // capped at max_side by the loader, by area
    } catch (const Error& e) {
      note_skip(report, e.what());
      continue;
    }
    std::vector<float> planar(3 * static_cast<size_t>(rgb.rows) * static_cast<size_t>(rgb.cols));
    append_planar(rgb, planar.data());
    corpus.photos.push_back(std::move(planar));
    corpus.heights.push_back(rgb.rows);
    corpus.widths.push_back(rgb.cols);
    corpus.names.push_back(fs::path(file).lexically_relative(dir).string());  // "a.jpg", "sub/b.jpg"
  }
  if (corpus.photos.empty()) throw Error(dir + ": has no readable photo");
  return corpus;
}

void sample_photo_crop(const PhotoCorpus& corpus, Rng& rng, int out_size, float min_scale, bool flip, float* out) {
  if (corpus.size() == 0) throw Error(corpus.source + ": the photo corpus is empty");
  crop_photo(corpus, rng.below(corpus.size()), rng, out_size, min_scale, flip, out);
}

namespace {

// The square (y0, x0, side) of photo i, mirrored when asked, resized to out (3, out_size, out_size).
void crop_square(const PhotoCorpus& corpus, size_t i, int y0, int x0, int side, bool mirrored, int out_size, float* out) {
  const int h = corpus.heights[i], w = corpus.widths[i];
  const int interpolation = interpolation_for(side, out_size);
  const size_t out_plane = static_cast<size_t>(out_size) * static_cast<size_t>(out_size);
  for (int c = 0; c < 3; ++c) {
    // Views, no copies: the photo's channel plane, and `out`'s plane as the resize target.
    const cv::Mat plane(h, w, CV_32F, const_cast<float*>(corpus.photos[i].data()) + static_cast<size_t>(c) * h * w);
    cv::Mat target(out_size, out_size, CV_32F, out + static_cast<size_t>(c) * out_plane);
    const cv::Mat crop = plane(cv::Rect(x0, y0, side, side));
    if (side == out_size) {
      crop.copyTo(target);
    } else {
      cv::resize(crop, target, target.size(), 0, 0, interpolation);
      for (int y = 0; y < out_size; ++y)
        for (float* v = target.ptr<float>(y); v != target.ptr<float>(y) + out_size; ++v) *v = unit(*v);
    }
    if (mirrored)
      for (int y = 0; y < out_size; ++y) std::reverse(target.ptr<float>(y), target.ptr<float>(y) + out_size);
  }
}

void check_crop(const PhotoCorpus& corpus, int index, int out_size) {
  if (index < 0 || index >= corpus.size())
    throw Error(corpus.source + ": photo " + std::to_string(index) + " is not in the corpus");
  if (out_size < 1) throw Error("photo crop: output size must be >= 1, got " + std::to_string(out_size));
}

}  // namespace

void crop_photo(const PhotoCorpus& corpus, int index, Rng& rng, int out_size, float min_scale, bool flip, float* out) {
  check_crop(corpus, index, out_size);
  if (!(min_scale > 0.0f && min_scale <= 1.0f))
    throw Error("photo crop: minimum scale must be in (0, 1], got " + std::to_string(min_scale));
  const size_t i = static_cast<size_t>(index);
  const int h = corpus.heights[i], w = corpus.widths[i];
  const int short_side = std::min(h, w);
  const double scale = min_scale + (1.0 - min_scale) * rng.uniform();
  const int side = std::clamp(static_cast<int>(std::lround(scale * short_side)), 1, short_side);
  const int y0 = rng.below(h - side + 1);
  const int x0 = rng.below(w - side + 1);
  const bool mirrored = flip && rng.below(2) == 1;
  crop_square(corpus, i, y0, x0, side, mirrored, out_size, out);
}

void centre_crop_photo(const PhotoCorpus& corpus, int index, int out_size, float* out) {
  check_crop(corpus, index, out_size);
  const size_t i = static_cast<size_t>(index);
  const int h = corpus.heights[i], w = corpus.widths[i], side = std::min(h, w);
  crop_square(corpus, i, (h - side) / 2, (w - side) / 2, side, false, out_size, out);
}

}  // namespace vitlens
