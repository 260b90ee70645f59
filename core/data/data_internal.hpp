#pragma once
// What the data loaders share inside core/data (not for other rooms): reporting what a load left
// out, converting decoded images to planar floats, and the interpolation rule.
//
//   random.cpp        Rng (xoshiro256**) and the labelled-image augmentation that draws from it
//   idx_reader.cpp    Fashion-MNIST from IDX files (gzip'd or not)
//   image_folder.cpp  DataWalker, ImageSet, ImageFolder trees and the held-out split
//   photo_corpus.cpp  the unlabelled photo corpus for masked patch prediction and its crops
#include <algorithm>
#include <string>

#include <opencv2/core.hpp>

#include "core/data/dataset.hpp"

namespace vitlens::data_internal {

// One skipped entry: counted, and kept as an example while fewer than 5 are.
void note_skip(FolderReport* report, const std::string& message);
// What a walk left out goes into the report: the same lines the user sees for unreadable images.
void note_walk(FolderReport* report, const FolderWalk& walk);
// Area and bilinear resampling round a sum of weights that should be 1: a white pixel can come
// out as 1.0000001. Every image here promises [0, 1].
inline float unit(float v) { return std::min(1.0f, std::max(0.0f, v)); }
// (h, w, 3) interleaved float -> (3, h, w) planar, written to `out`, clamped to [0, 1].
void append_planar(const cv::Mat& rgb, float* out);
// Down with area averaging (no aliasing), up with bilinear, as dataset.hpp promises.
int interpolation_for(int from_side, int to_side);
// Throws vitlens::Error unless `dir` is a folder; `what` says what was expected in it.
void require_folder(const std::string& dir, const std::string& what);

}  // namespace vitlens::data_internal
