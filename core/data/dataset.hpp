#pragma once
// Training data for `vitlens train`: labelled image sets (Fashion-MNIST IDX files, an
// ImageFolder tree) and an unlabelled photo corpus for masked patch prediction, plus the seeded
// random generator and the augmentations the trainer uses. Images are RGB float (3, H, W) in
// [0, 1], before the model's mean/std normalisation (the trainer applies it).
#include <cstdint>
#include <string>
#include <vector>

namespace vitlens {

// Deterministic, serialisable generator: xoshiro256** (Blackman and Vigna, 2018) with its four
// state words seeded by splitmix64 from `seed`, as the xoshiro authors recommend. The whole state
// is 4 x uint64 so a checkpoint can store it and resume bit-exactly (copy `s` out and back in).
struct Rng {
  uint64_t s[4];
  explicit Rng(uint64_t seed = 0);
  uint64_t next();                 // 64 random bits
  double uniform();                // [0, 1): the top 53 bits of next() / 2^53
  int below(int n);                // [0, n), n > 0, unbiased (rejection of the short last range)
  void shuffle(std::vector<int32_t>& v);  // Fisher-Yates with below(): i = n-1..1 swaps v[i], v[below(i+1)]
};

struct ImageSet {
  int height = 0, width = 0;              // every image has this size
  std::vector<float> pixels;              // (n, 3, H, W) in [0, 1]
  std::vector<int32_t> labels;            // (n) class index in [0, C)
  std::vector<std::string> class_names;   // (C)
  std::string source;                     // folder or files it came from, for messages
  int size() const;                       // n
  int num_classes() const;                // C
  const float* image(int i) const;        // pixels + i * 3 * H * W
};

// Fashion-MNIST from the IDX files in `dir` (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz],
// t10k-...; gzip read with zlib): gray replicated to 3 channels, 28 x 28, the 10 class names.
// `limit` > 0 keeps the first `limit` images. Throws vitlens::Error naming the file on a missing,
// truncated or malformed file (bad magic, counts that disagree, labels >= 10).
ImageSet load_fashion_mnist(const std::string& dir, bool train, int limit = 0);
std::string default_fashion_mnist_dir();  // /usr/share/datasets/fashion-mnist

// What a data folder load left out, for one warning line each. Unreadable files and folders,
// broken links and special files are skipped and counted in `skipped` (with up to 5 example
// messages), never fatal; folder links that leave the walk's folder are not followed (counted in
// `links_outside`, the first one named).
struct FolderReport {
  int skipped = 0;
  std::vector<std::string> examples;
  int links_outside = 0;
  std::string first_link_outside;  // "D/a/l: a link to /x, outside D/a"
};
// The one line to print about `links_outside` ("" when there were none).
std::string links_outside_warning(const FolderReport& report);

// Walking a data folder (the ImageFolder classes, the photo corpus), the way a careful tool does:
//  - each folder is read once per walk (device and inode seen): a link back to a folder already
//    read (`ln -s . l`, a link to a parent) adds nothing, so no walk loops or repeats;
//  - a link to a folder is followed only when its target is inside the folder the walk started
//    from: vitlens never reads outside the data folder it was given through a folder link (a link
//    to / or to a home folder reads nothing), it reports the link instead;
//  - a link to a file is read wherever it points (one file, through the image loader's limits:
//    how training sets are often assembled), and a file reached twice is listed once;
//  - hidden entries (names starting with '.') are ignored, only regular files are listed;
//  - one load reads at most kMaxDataEntries directory entries in all; more is a one-line error
//    naming the folder and the limit, raised before any image is decoded.
// An unreadable folder is one line naming it: an error for the folder the walk starts from, a
// skipped entry (FolderWalk::skipped) for a folder inside it.
constexpr long kMaxDataEntries = 1000000;

struct FolderWalk {
  std::vector<std::string> files;    // regular files, sorted by path, each (device, inode) once
  std::vector<std::string> folders;  // walk(.., false) only: the subfolders, sorted by name
  std::vector<std::string> skipped;  // one line each: unreadable folders, broken links, special files
  std::vector<std::string> links_outside;  // one line each: folder links not followed
};

class DataWalker {
 public:
  // `data_root` names the data in the limit's message; `max_entries` bounds every walk() together.
  explicit DataWalker(std::string data_root, long max_entries = kMaxDataEntries);
  // `folder` and, when `recursive`, every folder under it; otherwise its entries only.
  FolderWalk walk(const std::string& folder, bool recursive);
  long entries_read() const { return entries_; }

 private:
  std::string data_root_;
  long max_entries_;
  long entries_ = 0;
};

// One subfolder per class (sorted by name = class index, as torchvision's ImageFolder), any image
// OpenCV reads (through vitlens' own image loader: same limits and damage checks), resized to
// img_size x img_size (shorter side to img_size with area/linear interpolation, then centre crop).
// Unreadable files are skipped and counted in `report` (see FolderReport), never fatal.
// Throws vitlens::Error on: not a folder, no class folders, a single class, an empty class folder.
// The classes are walked by DataWalker: a class folder may be a link to a folder inside `dir`,
// and each class holds the files inside its own folder (a link out of it is not followed).
ImageSet load_image_folder(const std::string& dir, int img_size, FolderReport* report);

// A seeded held-out split: `val_fraction` of each class (at least 1 image per class when the class
// has 2 or more) goes to `val`, the rest to `train`; same seed, same split. val_fraction in [0, 1);
// 0 gives an empty `val`. Both sets keep the images' original order.
void split_holdout(const ImageSet& all, double val_fraction, uint64_t seed, ImageSet* train, ImageSet* val);

// The labelled images a classifier run trains and evaluates on, as `vitlens train --data` and the
// viewer's Train window both read them: `data` is "fashion-mnist" (its training and test files,
// 28 px) or a folder of one subfolder per class (images resized to img_size); limit > 0 keeps the
// first `limit` images of each set. val_split > 0 holds that fraction of the training images out
// (split_holdout with `seed`) as the evaluation set, "val", and keeps Fashion-MNIST's test set
// aside in `test` when keep_test; otherwise Fashion-MNIST evaluates on its test set ("test") and a
// folder has no evaluation set (""). Throws vitlens::Error naming `data` when it is neither.
struct LabelledData {
  ImageSet train, eval, test;  // test: only beside a "val" evaluation set, with keep_test
  std::string eval_name;       // "test", "val" or ""
  FolderReport report;         // a folder's files left out (unused for Fashion-MNIST)
};
LabelledData load_labelled_data(const std::string& data, int img_size, int limit, double val_split, uint64_t seed,
                                bool keep_test);

// Unlabelled photos for masked patch prediction (MAE): whole images kept at their size (long side
// capped at `max_side` by area downscaling), sampled as random crops. Reads the files in `dir` and
// its subfolders (DataWalker: recursively, hidden entries ignored, each file once), sorted by path;
// files that are not images are skipped and counted.
struct PhotoCorpus {
  std::vector<std::vector<float>> photos;  // each (3, h_i, w_i) in [0, 1]
  std::vector<int> heights, widths;
  std::vector<std::string> names;  // paths relative to the folder, sorted
  std::string source;
  int size() const;
};
PhotoCorpus load_photo_corpus(const std::string& dir, int max_side, FolderReport* report);
std::string default_photo_dir();  // /usr/share/doc/opencv-doc/examples/data
// A random crop of side in [min_scale, 1] x the photo's short side, random position, optional
// horizontal flip, resized to out_size x out_size (area/linear): out (3, out_size, out_size).
// Draws, in order: the photo (below), the side (uniform), y0, x0 (below), the flip (below(2), only
// when `flip`).
void sample_photo_crop(const PhotoCorpus& corpus, Rng& rng, int out_size, float min_scale, bool flip, float* out);
// The same crop of a given photo `index`: draws the side, y0, x0 and the flip (as above, without the photo).
void crop_photo(const PhotoCorpus& corpus, int index, Rng& rng, int out_size, float min_scale, bool flip, float* out);
// The centred square of a photo's short side, resized to out_size x out_size, no randomness (the
// viewer's Train window shows it as the probe of an MAE run): out (3, out_size, out_size).
void centre_crop_photo(const PhotoCorpus& corpus, int index, int out_size, float* out);

// Augmentation for labelled images (as torchvision RandomCrop(padding=pad) + RandomHorizontalFlip):
// zero-pad by `pad`, take a random H x W crop, flip with probability 1/2 when `flip`. in/out (3, H, W).
// Draws, in order: dy = below(2 pad + 1), dx = below(2 pad + 1), then below(2) == 1 flips (only
// when `flip`). `in` and `out` may be the same buffer.
void augment_crop_flip(const float* in, int height, int width, int pad, bool flip, Rng& rng, float* out);

}  // namespace vitlens
