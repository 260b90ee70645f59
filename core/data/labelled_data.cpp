// The labelled images of a classifier run (dataset.hpp load_labelled_data): Fashion-MNIST or an
// image folder, trimmed to a limit and split into training and evaluation sets, one way for the
// command line and the viewer.
#include <sys/stat.h>

#include "core/base/error.hpp"
#include "core/data/dataset.hpp"

namespace vitlens {

namespace {

bool is_folder(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The first `limit` images of `set` (all when limit <= 0).
void keep_first(ImageSet& set, int limit) {
  if (limit <= 0 || set.size() <= limit) return;
  set.pixels.resize(static_cast<size_t>(limit) * 3 * set.height * set.width);
  set.labels.resize(static_cast<size_t>(limit));
}

}  // namespace

LabelledData load_labelled_data(const std::string& data, int img_size, int limit, double val_split, uint64_t seed,
                                bool keep_test) {
  LabelledData d;
  ImageSet all;
  ImageSet test;  // Fashion-MNIST's test images
  if (data == "fashion-mnist") {
    const std::string dir = default_fashion_mnist_dir();
    all = load_fashion_mnist(dir, true, limit);
    if (val_split <= 0.0 || keep_test) test = load_fashion_mnist(dir, false, limit);
  } else {
    if (!is_folder(data)) throw Error(data + ": the training data is neither 'fashion-mnist', a folder nor photos[:DIR]");
    all = load_image_folder(data, img_size, &d.report);
    keep_first(all, limit);
  }
  if (val_split > 0.0) {
    split_holdout(all, val_split, seed, &d.train, &d.eval);
    d.eval_name = "val";
    d.test = std::move(test);
  } else {
    d.train = std::move(all);
    if (test.size() > 0) {
      d.eval = std::move(test);
      d.eval_name = "test";
    }
  }
  return d;
}

}  // namespace vitlens
