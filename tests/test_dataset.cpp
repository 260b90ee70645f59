// Training data: Fashion-MNIST against facts about the files, malformed IDX files made
// here, ImageFolder trees made here, the held-out split, the generator and the augmentations.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <zlib.h>

#include "test_support.hpp"
#include "core/data/dataset.hpp"
#include "core/base/error.hpp"
#include "core/train/mae_objective.hpp"

using namespace vitlens;
namespace fs = std::filesystem;

namespace {

// Catch matcher: the message is one line and names `what`.
Catch::Matchers::StdString::ContainsMatcher names(const std::string& what) { return Catch::Contains(what); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

std::string u32be(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// IDX file bytes: magic 0x0000 08 <ndim>, big-endian dims, then the unsigned bytes.
std::string idx_bytes(const std::vector<uint32_t>& dims, const std::vector<unsigned char>& data) {
  std::string b = u32be(0x800u + static_cast<uint32_t>(dims.size()));
  for (uint32_t d : dims) b += u32be(d);
  b.append(data.begin(), data.end());
  return b;
}

// A tiny valid t10k set: 3 images of 2 x 2 with pixel k of image i = 10 i + k, labels 4, 0, 9.
std::string tiny_images() { return idx_bytes({3, 2, 2}, {0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 255}); }
std::string tiny_labels() { return idx_bytes({3}, {4, 0, 9}); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Fashion-MNIST: the real files of the dataset-fashion-mnist package.
// ---------------------------------------------------------------------------------------------

TEST_CASE("Fashion-MNIST loads with the dataset's known counts, labels and pixels", "[dataset][fashion]") {
  // Facts from the files (checked with Python's gzip + numpy): 60000 / 10000 images, 6000 / 1000
  // per class, first train labels 9 0 0 3 0 2 7 2 5 5, first test labels 9 2 1 1 6; pixels 0..255;
  // train image 0 sums to 76247 and its row 14 is listed below.
  const ImageSet train = load_fashion_mnist(default_fashion_mnist_dir(), true);
  REQUIRE(train.size() == 60000);
  REQUIRE(train.height == 28);
  REQUIRE(train.width == 28);
  REQUIRE(train.num_classes() == 10);
  CHECK(train.class_names[9] == "Ankle boot");
  CHECK(train.class_names[0] == "T-shirt/top");
  REQUIRE(train.pixels.size() == size_t{60000} * 3 * 28 * 28);
  const std::vector<int32_t> first{9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
  CHECK(std::vector<int32_t>(train.labels.begin(), train.labels.begin() + 10) == first);
  std::vector<int> per_class(10, 0);
  for (int32_t l : train.labels) ++per_class[static_cast<size_t>(l)];
  CHECK(per_class == std::vector<int>(10, 6000));
  const auto [lo, hi] = std::minmax_element(train.pixels.begin(), train.pixels.end());
  CHECK(*lo == 0.0f);
  CHECK(*hi == 1.0f);

  const float* img0 = train.image(0);
  double sum = 0;
  for (int k = 0; k < 28 * 28; ++k) sum += img0[k];
  CHECK(sum * 255.0 == Approx(76247.0).margin(1e-2));
  const std::vector<int> row14{0, 0, 1, 4, 6, 7, 2, 0, 0, 0, 0, 0, 237, 226, 217, 223, 222, 219, 222, 221, 216, 223, 229, 215, 218, 255, 77, 0};
  for (int x = 0; x < 28; ++x) CHECK(img0[14 * 28 + x] == Approx(row14[static_cast<size_t>(x)] / 255.0f).margin(1e-7));
  // Gray replicated: R, G and B planes equal for a few images across the set.
  for (int i : {0, 1, 12345, 59999}) {
    const float* img = train.image(i);
    CHECK(std::equal(img, img + 784, img + 784));
    CHECK(std::equal(img, img + 784, img + 2 * 784));
  }
  CHECK_THAT(train.source, Catch::Contains("train-images-idx3-ubyte"));

  const ImageSet test = load_fashion_mnist(default_fashion_mnist_dir(), false, 0);
  CHECK(test.size() == 10000);
  CHECK(std::vector<int32_t>(test.labels.begin(), test.labels.begin() + 5) == std::vector<int32_t>{9, 2, 1, 1, 6});

  const ImageSet few = load_fashion_mnist(default_fashion_mnist_dir(), false, 7);
  REQUIRE(few.size() == 7);
  REQUIRE(few.pixels.size() == size_t{7} * 3 * 784);
  CHECK(std::equal(few.pixels.begin(), few.pixels.end(), test.pixels.begin()));
  CHECK(load_fashion_mnist(default_fashion_mnist_dir(), false, 20000).size() == 10000);  // limit past the end: all
}

TEST_CASE("IDX files: plain and gzip read alike, malformed files give one line naming the file", "[dataset][fashion][errors]") {
  const std::string root = test::temp_dir("idx");
  SECTION("a valid tiny set, plain and gzip") {
    write_bytes(root + "/t10k-images-idx3-ubyte", tiny_images());
    write_gzip(root + "/t10k-labels-idx1-ubyte.gz", tiny_labels());
    const ImageSet s = load_fashion_mnist(root, false);
    REQUIRE(s.size() == 3);
    CHECK(s.height == 2);
    CHECK(s.width == 2);
    CHECK(s.labels == std::vector<int32_t>{4, 0, 9});
    // image 2: pixels 20 21 22 255 in each of the three planes
    const float* img = s.image(2);
    for (int c = 0; c < 3; ++c) {
      CHECK(img[c * 4 + 0] == Approx(20 / 255.0f));
      CHECK(img[c * 4 + 3] == 1.0f);
    }
    CHECK(s.image(1)[5] == Approx(11 / 255.0f));  // image 1, plane G, pixel 1
    CHECK(load_fashion_mnist(root, false, 2).size() == 2);
    CHECK_THROWS_WITH(load_fashion_mnist(root, false, -1), names("limit"));
  }

  // Each malformed case: the images and labels written, the message must name `culprit`.
  auto expect = [&](const std::string& images, const std::string& labels, const std::string& culprit,
                    const std::string& words) {
    const std::string dir = test::temp_dir("idxbad");
    write_bytes(dir + "/t10k-images-idx3-ubyte", images);
    write_bytes(dir + "/t10k-labels-idx1-ubyte", labels);
    const std::string message = error_of([&] { load_fashion_mnist(dir, false); });
    INFO(message);
    CHECK_THAT(message, names(culprit));
    CHECK_THAT(message, Catch::Contains(words));
    CHECK(message.find('\n') == std::string::npos);
  };
  SECTION("bad magic") {
    std::string images = tiny_images();
    images[3] = 1;  // claims one dimension
    expect(images, tiny_labels(), "t10k-images-idx3-ubyte", "bad magic");
    expect(tiny_images(), "GIF89a" + tiny_labels(), "t10k-labels-idx1-ubyte", "bad magic");
    expect(tiny_images(), tiny_images(), "t10k-labels-idx1-ubyte", "bad magic");  // images given as labels
  }
  SECTION("truncated") {
    const std::string images = tiny_images();
    expect(images.substr(0, images.size() - 1), tiny_labels(), "t10k-images-idx3-ubyte", "truncated");
    expect(images.substr(0, 10), tiny_labels(), "t10k-images-idx3-ubyte", "truncated");
    expect(images.substr(0, 2), tiny_labels(), "t10k-images-idx3-ubyte", "truncated");
    expect(tiny_images(), "", "t10k-labels-idx1-ubyte", "empty");
    expect(tiny_images(), tiny_labels() + "x", "t10k-labels-idx1-ubyte", "1 bytes after");
  }
  SECTION("counts that disagree, labels out of range, empty set") {
    expect(tiny_images(), idx_bytes({2}, {1, 2}), "t10k-images-idx3-ubyte", "3 images but");
    expect(tiny_images(), idx_bytes({3}, {1, 10, 2}), "t10k-labels-idx1-ubyte", "label 10 at index 1");
    expect(idx_bytes({0, 2, 2}, {}), idx_bytes({0}, {}), "t10k-images-idx3-ubyte", "no images");
    expect(idx_bytes({1, 0, 2}, {}), idx_bytes({1}, {1}), "t10k-images-idx3-ubyte", "image size 0x2");
    // A header announcing 4 G images must be refused from the header, not by allocating.
    expect(idx_bytes({0xffffffffu, 28, 28}, {1, 2}), tiny_labels(), "t10k-images-idx3-ubyte", "more than");
  }
  SECTION("bad gzip") {
    const std::string dir = test::temp_dir("idxgz");
    write_gzip(dir + "/t10k-images-idx3-ubyte.gz", tiny_images());
    // gzip magic, then garbage
    write_bytes(dir + "/t10k-labels-idx1-ubyte.gz", std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10) + "garbage, not deflate data at all");
    std::string message = error_of([&] { load_fashion_mnist(dir, false); });
    CHECK_THAT(message, names("t10k-labels-idx1-ubyte.gz") && Catch::Contains("gzip"));
    // a real gzip stream cut short
    std::string packed;
    {
      // 5000 labels (more than the images: the damage below is found first), gzip'd
      write_gzip(dir + "/whole.gz", idx_bytes({5000}, std::vector<unsigned char>(5000, 3)));
      std::ifstream in(dir + "/whole.gz", std::ios::binary);
      packed.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    write_bytes(dir + "/t10k-labels-idx1-ubyte.gz", packed.substr(0, packed.size() / 2));
    message = error_of([&] { load_fashion_mnist(dir, false); });
    CHECK_THAT(message, names("t10k-labels-idx1-ubyte.gz") && Catch::Contains("truncated"));
    // a damaged CRC
    packed[packed.size() - 6] = static_cast<char>(packed[packed.size() - 6] ^ 0x55);
    write_bytes(dir + "/t10k-labels-idx1-ubyte.gz", packed);
    message = error_of([&] { load_fashion_mnist(dir, false); });
    CHECK_THAT(message, names("t10k-labels-idx1-ubyte.gz") && Catch::Contains("damaged gzip"));
    // .gz that is not gzip at all
    write_bytes(dir + "/t10k-labels-idx1-ubyte.gz", tiny_labels());
    message = error_of([&] { load_fashion_mnist(dir, false); });
    CHECK_THAT(message, names("t10k-labels-idx1-ubyte.gz") && Catch::Contains("not gzip"));
    CHECK(message.find('\n') == std::string::npos);
  }
  SECTION("missing files and folders") {
    const std::string dir = test::temp_dir("idxmissing");
    CHECK_THROWS_WITH(load_fashion_mnist(dir, true), names("train-images-idx3-ubyte") && Catch::Contains("no such file"));
    write_bytes(dir + "/train-images-idx3-ubyte", tiny_images());
    CHECK_THROWS_WITH(load_fashion_mnist(dir, true), names("train-labels-idx1-ubyte"));
    CHECK_THROWS_WITH(load_fashion_mnist(dir + "/nowhere", true), names("nowhere") && Catch::Contains("not a folder"));
    fs::create_directory(dir + "/train-labels-idx1-ubyte");  // a folder where a file should be
    CHECK_THROWS_WITH(load_fashion_mnist(dir, true), names("train-labels-idx1-ubyte") && Catch::Contains("folder"));
  }
}

// ---------------------------------------------------------------------------------------------
// ImageFolder
// ---------------------------------------------------------------------------------------------

TEST_CASE("ImageFolder: classes sorted, images resized and centre-cropped, unreadable files skipped", "[dataset][folder]") {
  const std::string root = test::temp_dir("folder");
  for (const char* c : {"cat", "dog", "Eel"}) fs::create_directory(root + "/" + c);
  // cat: a horizontal ramp 8 wide x 4 high (gray = 10 x); at size 4 the short side already is 4,
  // so no resampling: the centre crop starts at column round((8 - 4) / 2) = 2.
  cv::Mat ramp(4, 8, CV_8UC1);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 8; ++x) ramp.at<unsigned char>(y, x) = static_cast<unsigned char>(10 * x);
  REQUIRE(cv::imwrite(root + "/cat/a_ramp.png", ramp));
  // dog: a pure red 2 x 2 (BGR on disk), upscaled to 4 x 4: a constant stays constant.
  REQUIRE(cv::imwrite(root + "/dog/red.png", cv::Mat(2, 2, CV_8UC3, cv::Scalar(0, 0, 255))));
  write_bytes(root + "/dog/broken.png", "not a png at all");  // unreadable: skipped and counted
  write_bytes(root + "/dog/.DS_Store", "hidden files are not images");  // hidden: ignored
  fs::create_directory(root + "/dog/nested");
  REQUIRE(cv::imwrite(root + "/dog/nested/blue.png", cv::Mat(12, 6, CV_8UC3, cv::Scalar(255, 0, 0))));
  // Eel (sorts before cat: byte order, as Python's sorted): a 16 x 16 gray 128.
  REQUIRE(cv::imwrite(root + "/Eel/gray.jpg", cv::Mat(16, 16, CV_8UC1, cv::Scalar(128))));
  // Eel: a 1 x 5000 strip, dark at the ends and 200 in its centre 1 x 1 (the centred square).
  cv::Mat strip(1, 5000, CV_8UC1, cv::Scalar(0));
  strip.at<unsigned char>(0, 2499) = 200;
  REQUIRE(cv::imwrite(root + "/Eel/strip.png", strip));
  fs::create_directory(root + "/.hidden_class");  // ignored, not a class

  FolderReport report;
  const ImageSet s = load_image_folder(root, 4, &report);
  REQUIRE(s.class_names == std::vector<std::string>{"Eel", "cat", "dog"});
  REQUIRE(s.size() == 5);
  CHECK(s.labels == std::vector<int32_t>{0, 0, 1, 2, 2});
  CHECK(s.height == 4);
  CHECK(s.width == 4);
  CHECK(report.skipped == 1);
  REQUIRE(report.examples.size() == 1);
  CHECK_THAT(report.examples[0], Catch::Contains("broken.png"));
  CHECK(s.source == root);

  // Eel: gray 128 everywhere (JPEG keeps a flat field exact to +-1).
  for (int k = 0; k < 3 * 16; ++k) CHECK(s.image(0)[k] == Approx(128 / 255.0f).margin(1.5 / 255));
  // Eel/strip.png: its centred 1 x 1 square (column (5000 - 1) / 2 = 2499) upscaled: 200 everywhere.
  for (int k = 0; k < 3 * 16; ++k) CHECK(s.image(1)[k] == Approx(200 / 255.0f).margin(1e-6));
  // cat: out[c][y][x] = 10 (x + 2) / 255 for every channel and row
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 4; ++x) CHECK(s.image(2)[(c * 4 + y) * 4 + x] == Approx(10 * (x + 2) / 255.0f).margin(1e-6));
  // Files sort by path: dog/nested/blue.png before dog/red.png, so image 3 is blue, image 4 red.
  for (int k = 0; k < 16; ++k) {
    CHECK(s.image(3)[k] == 0.0f);            // R
    CHECK(s.image(3)[32 + k] == 1.0f);       // B
    CHECK(s.image(4)[k] == Approx(1.0f));    // R
    CHECK(s.image(4)[16 + k] == Approx(0.0f));
  }
  // No report pointer: still skips.
  CHECK(load_image_folder(root, 3, nullptr).size() == 5);
}

TEST_CASE("ImageFolder errors: not a folder, no classes, one class, an empty class", "[dataset][folder][errors]") {
  const std::string root = test::temp_dir("folderbad");
  FolderReport report;
  auto one_line = [](const std::string& m) { return m.find('\n') == std::string::npos; };

  std::string m = error_of([&] { load_image_folder(root + "/missing", 8, &report); });
  CHECK_THAT(m, names("missing") && Catch::Contains("no such folder"));
  write_bytes(root + "/file.png", "x");
  m = error_of([&] { load_image_folder(root + "/file.png", 8, &report); });
  CHECK_THAT(m, names("file.png") && Catch::Contains("not a folder"));
  CHECK(one_line(m));
  m = error_of([&] { load_image_folder(root, 8, &report); });  // only a file in it
  CHECK_THAT(m, names(root) && Catch::Contains("no class folders"));

  fs::create_directory(root + "/only");
  REQUIRE(cv::imwrite(root + "/only/a.png", cv::Mat(4, 4, CV_8UC3, cv::Scalar(1, 2, 3))));
  m = error_of([&] { load_image_folder(root, 8, &report); });
  CHECK_THAT(m, names(root) && Catch::Contains("single class folder (only)"));

  fs::create_directory(root + "/zempty");
  m = error_of([&] { load_image_folder(root, 8, &report); });
  CHECK_THAT(m, names("zempty") && Catch::Contains("is empty"));
  CHECK(one_line(m));

  write_bytes(root + "/zempty/bad.jpg", "not an image");
  m = error_of([&] { load_image_folder(root, 8, &report); });
  CHECK_THAT(m, names("zempty") && Catch::Contains("no readable image"));

  REQUIRE(cv::imwrite(root + "/zempty/b.png", cv::Mat(4, 4, CV_8UC3, cv::Scalar(1, 2, 3))));
  CHECK(load_image_folder(root, 8, &report).size() == 2);
  CHECK_THROWS_WITH(load_image_folder(root, 0, &report), Catch::Contains("image size"));
}

// ---------------------------------------------------------------------------------------------
// Held-out split
// ---------------------------------------------------------------------------------------------

TEST_CASE("held-out split: seeded, per-class shares, every image in exactly one side", "[dataset][split]") {
  // 3 classes of 10, 5 and 1 images, 1 x 1 pixels; pixel value = the image's index (its identity).
  ImageSet all;
  all.height = all.width = 1;
  all.class_names = {"a", "b", "c"};
  all.source = "synthetic";
  for (int i = 0; i < 16; ++i) {
    all.labels.push_back(i < 10 ? 0 : i < 15 ? 1 : 2);
    for (int c = 0; c < 3; ++c) all.pixels.push_back(static_cast<float>(i));
  }
  ImageSet train, val;
  split_holdout(all, 0.2, 7, &train, &val);
  auto count = [](const ImageSet& s, int label) { return static_cast<int>(std::count(s.labels.begin(), s.labels.end(), label)); };
  CHECK(count(val, 0) == 2);  // round(0.2 x 10)
  CHECK(count(val, 1) == 1);  // round(0.2 x 5)
  CHECK(count(val, 2) == 0);  // a class of one stays in train
  CHECK(count(train, 0) == 8);
  CHECK(count(train, 1) == 4);
  CHECK(count(train, 2) == 1);
  CHECK(train.class_names == all.class_names);
  CHECK(val.height == 1);
  // Every image exactly once, with its own label and all three channels.
  std::multiset<int> seen;
  for (const ImageSet* part : {&train, &val})
    for (int i = 0; i < part->size(); ++i) {
      const int id = static_cast<int>(part->image(i)[0]);
      seen.insert(id);
      CHECK(part->labels[static_cast<size_t>(i)] == all.labels[static_cast<size_t>(id)]);
      CHECK(part->image(i)[2] == static_cast<float>(id));
    }
  CHECK(seen == std::multiset<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});

  // Same seed, same split; other seeds give other splits.
  ImageSet train2, val2;
  split_holdout(all, 0.2, 7, &train2, &val2);
  CHECK(val2.pixels == val.pixels);
  CHECK(train2.pixels == train.pixels);
  int differ = 0;
  for (uint64_t seed = 8; seed < 18; ++seed) {
    split_holdout(all, 0.2, seed, &train2, &val2);
    differ += val2.pixels != val.pixels;
  }
  CHECK(differ >= 8);

  // A tiny fraction still holds out one of each class of 2 or more; 0 holds out nothing.
  split_holdout(all, 0.01, 1, &train2, &val2);
  CHECK(val2.size() == 2);
  CHECK(count(val2, 0) == 1);
  CHECK(count(val2, 1) == 1);
  split_holdout(all, 0.0, 1, &train2, &val2);
  CHECK(val2.size() == 0);
  CHECK(train2.size() == 16);
  // Nearly everything: each class keeps one training image.
  split_holdout(all, 0.99, 1, &train2, &val2);
  CHECK(count(train2, 0) == 1);
  CHECK(count(train2, 1) == 1);
  CHECK(count(train2, 2) == 1);
  // The split may overwrite its own input.
  ImageSet copy = all;
  split_holdout(copy, 0.2, 7, &copy, &val2);
  CHECK(copy.pixels == train.pixels);
  CHECK_THROWS_WITH(split_holdout(all, 1.0, 1, &train2, &val2), Catch::Contains("[0, 1)"));
  CHECK_THROWS_WITH(split_holdout(all, -0.1, 1, &train2, &val2), Catch::Contains("synthetic"));
}

// ---------------------------------------------------------------------------------------------
// Rng
// ---------------------------------------------------------------------------------------------

TEST_CASE("Rng: splitmix64 + xoshiro256** reference values, state round-trip, unbiased draws", "[dataset][rng]") {
  // Reference values from an independent Python implementation of the authors' C code
  // (splitmix64 of 0 first gives 0xe220a8397b1dcdaf, the published first output).
  Rng zero(0);
  CHECK(zero.s[0] == 0xe220a8397b1dcdafULL);
  CHECK(zero.s[3] == 0xf88bb8a8724c81ecULL);
  CHECK(zero.next() == 0x99ec5f36cb75f2b4ULL);
  CHECK(zero.next() == 0xbf6e1f784956452aULL);
  CHECK(zero.next() == 0x1a5f849d4933e6e0ULL);
  Rng r42(42);
  CHECK(r42.next() == 0x15780b2e0c2ec716ULL);
  CHECK(r42.next() == 0x6104d9866d113a7eULL);
  CHECK(r42.next() == 0xae17533239e499a1ULL);

  // State round-trip: the 4 words are the whole state, as a checkpoint stores them.
  Rng a(123);
  for (int i = 0; i < 17; ++i) a.next();
  uint64_t saved[4];
  std::copy(std::begin(a.s), std::end(a.s), saved);
  Rng b(999);
  std::copy(std::begin(saved), std::end(saved), b.s);
  for (int i = 0; i < 100; ++i) {
    REQUIRE(a.next() == b.next());
    REQUIRE(a.uniform() == b.uniform());
    REQUIRE(a.below(37) == b.below(37));
  }

  // uniform in [0, 1) with mean 1/2 and variance 1/12 (200000 draws: std error 6.5e-4).
  Rng u(5);
  double sum = 0, sum2 = 0, lo = 1, hi = 0;
  const int draws = 200000;
  for (int i = 0; i < draws; ++i) {
    const double x = u.uniform();
    sum += x;
    sum2 += x * x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  CHECK(lo >= 0.0);
  CHECK(hi < 1.0);
  CHECK(sum / draws == Approx(0.5).margin(0.003));
  CHECK(sum2 / draws - (sum / draws) * (sum / draws) == Approx(1.0 / 12).margin(0.002));

  // below(n): in range; each of 3 values 1/3 of the time (300000 draws: std error 8.6e-4).
  std::vector<int> hist(3, 0);
  for (int i = 0; i < 300000; ++i) ++hist[static_cast<size_t>(u.below(3))];
  for (int h : hist) CHECK(h / 300000.0 == Approx(1.0 / 3).margin(0.004));
  // At n = 3 * 2^29 (just under 2^31), modulo without rejection would give the lower third of
  // the values a 1 / 2^33 excess: undetectable here, so check the range and spread instead.
  const int big = 3 * (1 << 29);
  int upper = 0;
  for (int i = 0; i < 20000; ++i) {
    const int v = u.below(big);
    REQUIRE(v >= 0);
    REQUIRE(v < big);
    upper += v >= big / 2;
  }
  CHECK(upper / 20000.0 == Approx(0.5).margin(0.02));
  CHECK(u.below(1) == 0);
  CHECK_THROWS_AS(u.below(0), Error);

  // shuffle: a permutation, seeded, and every position reachable.
  std::vector<int32_t> v(10);
  std::iota(v.begin(), v.end(), 0);
  std::vector<int32_t> w = v;
  Rng s1(77), s2(77);
  s1.shuffle(v);
  s2.shuffle(w);
  CHECK(v == w);
  std::vector<int32_t> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  std::vector<std::vector<int>> where(3, std::vector<int>(3, 0));  // element e lands at position p
  for (int t = 0; t < 30000; ++t) {
    std::vector<int32_t> x{0, 1, 2};
    s1.shuffle(x);
    for (int p = 0; p < 3; ++p) ++where[static_cast<size_t>(x[static_cast<size_t>(p)])][static_cast<size_t>(p)];
  }
  for (const auto& row : where)
    for (int n : row) CHECK(n / 30000.0 == Approx(1.0 / 3).margin(0.02));
}

// ---------------------------------------------------------------------------------------------
// Augmentation
// ---------------------------------------------------------------------------------------------

TEST_CASE("augment_crop_flip matches hand-computed crops and flips", "[dataset][augment]") {
  // A 2 x 3 image (H = 2, W = 3), in[c][y][x] = 100 c + 10 y + x + 1, padded by 1 to 4 x 5.
  std::vector<float> in(18);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 2; ++y)
      for (int x = 0; x < 3; ++x) in[static_cast<size_t>((c * 2 + y) * 3 + x)] = static_cast<float>(100 * c + 10 * y + x + 1);
  // The documented draws: dy = below(3), dx = below(3), flip = below(2). Find seeds for two cases.
  auto seed_for = [](int dy, int dx, int flip) {
    for (uint64_t seed = 0;; ++seed) {
      Rng r(seed);
      const int a = r.below(3), b = r.below(3), f = r.below(2);
      if (a == dy && b == dx && f == flip) return seed;
    }
  };
  // dy = 0, dx = 2, flipped: out[y][x] = padded[y][(W-1-x) + 2] = in[y-1][(2-x) + 1]:
  //   row 0 is padding; row 1 = in row 0 at columns 3 (outside), 2, 1.
  std::vector<float> out(18, -1.0f);
  Rng r1(seed_for(0, 2, 1));
  augment_crop_flip(in.data(), 2, 3, 1, true, r1, out.data());
  for (int c = 0; c < 3; ++c) {
    const float b = 100.0f * c;
    const std::vector<float> expected{0, 0, 0, 0, b + 3, b + 2};
    CHECK(std::vector<float>(out.begin() + c * 6, out.begin() + c * 6 + 6) == expected);
  }
  // dy = 2, dx = 0, not flipped: out[y][x] = in[y+1][x-1]: row 0 = 0, in[1][0], in[1][1]; row 1 padding.
  Rng r2(seed_for(2, 0, 0));
  augment_crop_flip(in.data(), 2, 3, 1, true, r2, out.data());
  for (int c = 0; c < 3; ++c) {
    const float b = 100.0f * c;
    const std::vector<float> expected{0, b + 11, b + 12, 0, 0, 0};
    CHECK(std::vector<float>(out.begin() + c * 6, out.begin() + c * 6 + 6) == expected);
  }
  // In place gives the same as out of place.
  std::vector<float> same = in;
  Rng r3(seed_for(0, 2, 1));
  augment_crop_flip(same.data(), 2, 3, 1, true, r3, same.data());
  CHECK(same[4] == 3.0f);
  CHECK(same[5] == 2.0f);
  CHECK(same[10] == 103.0f);
  // pad 0 without flip is the identity; with flip the mirror, about half the time.
  Rng r4(3);
  augment_crop_flip(in.data(), 2, 3, 0, false, r4, out.data());
  CHECK(out == in);
  int flips = 0;
  for (int t = 0; t < 2000; ++t) {
    augment_crop_flip(in.data(), 2, 3, 0, true, r4, out.data());
    if (out != in) {
      ++flips;
      REQUIRE(out[0] == 3.0f);
      REQUIRE(out[2] == 1.0f);
    }
  }
  CHECK(flips / 2000.0 == Approx(0.5).margin(0.05));
  CHECK_THROWS_AS(augment_crop_flip(in.data(), 2, 3, -1, false, r4, out.data()), Error);
}

// ---------------------------------------------------------------------------------------------
// Photo corpus (the opencv-doc package's example photos, read where they are)
// ---------------------------------------------------------------------------------------------

TEST_CASE("photo corpus: every image in the folder, capped, the rest skipped and counted", "[dataset][photos]") {
  const std::string dir = default_photo_dir();
  FolderReport report;
  const PhotoCorpus corpus = load_photo_corpus(dir, 128, &report);
  // Every regular, non-hidden file under the folder (recursively: dnn/ holds text files) is either a
  // photo or a skipped file.
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string()[0] != '.') ++files;
  CHECK(corpus.size() + report.skipped == files);
  CHECK(corpus.size() >= 80);  // 91 JPEG/PNG files in opencv-doc 4.6
  CHECK(report.skipped >= 1);  // .avi, .xml, .yml, .txt
  CHECK(report.examples.size() == std::min<size_t>(5, static_cast<size_t>(report.skipped)));
  CHECK(std::is_sorted(corpus.names.begin(), corpus.names.end()));
  CHECK(corpus.source == dir);
  REQUIRE(corpus.heights.size() == corpus.photos.size());
  REQUIRE(corpus.widths.size() == corpus.photos.size());
  for (int i = 0; i < corpus.size(); ++i) {
    const size_t k = static_cast<size_t>(i);
    CHECK(std::max(corpus.heights[k], corpus.widths[k]) <= 128);
    CHECK(corpus.photos[k].size() == 3 * static_cast<size_t>(corpus.heights[k]) * static_cast<size_t>(corpus.widths[k]));
    const auto [lo, hi] = std::minmax_element(corpus.photos[k].begin(), corpus.photos[k].end());
    CHECK(*lo >= 0.0f);
    CHECK(*hi <= 1.0f);
  }
  // box.png: 324 x 223 gray. Long side to 128: 128 x round(223 x 128 / 324) = 128 x 88; gray
  // replicated; area averaging keeps the mean (compared with OpenCV's own read at full size).
  const auto box = std::find(corpus.names.begin(), corpus.names.end(), "box.png");
  REQUIRE(box != corpus.names.end());
  const size_t bi = static_cast<size_t>(box - corpus.names.begin());
  CHECK(corpus.widths[bi] == 128);
  CHECK(corpus.heights[bi] == 88);
  const std::vector<float>& bp = corpus.photos[bi];
  const size_t plane = 128 * 88;
  CHECK(std::equal(bp.begin(), bp.begin() + plane, bp.begin() + plane));
  const double mean = std::accumulate(bp.begin(), bp.begin() + plane, 0.0) / plane;
  const cv::Mat full = cv::imread(dir + "/box.png", cv::IMREAD_GRAYSCALE);
  REQUIRE(!full.empty());
  CHECK(mean == Approx(cv::mean(full)[0] / 255.0).margin(0.005));

  CHECK_THROWS_WITH(load_photo_corpus(dir + "/dnn", 128, &report), Catch::Contains("no readable photo"));
  CHECK_THROWS_WITH(load_photo_corpus(dir + "/nowhere", 128, &report), Catch::Contains("nowhere"));
  CHECK_THROWS_WITH(load_photo_corpus(dir, 0, &report), Catch::Contains(">= 1"));
}

TEST_CASE("sample_photo_crop: exact window, flip, bounds and determinism", "[dataset][photos]") {
  // One synthetic 6 x 10 photo (h = 6, w = 10), value = (c * 100 + y * 10 + x) / 1000.
  PhotoCorpus one;
  one.source = "synthetic";
  one.heights = {6};
  one.widths = {10};
  one.names = {"ramp"};
  one.photos.emplace_back(3 * 6 * 10);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 6; ++y)
      for (int x = 0; x < 10; ++x) one.photos[0][static_cast<size_t>((c * 6 + y) * 10 + x)] = (c * 100 + y * 10 + x) / 1000.0f;
  // min_scale 1 and out_size = short side (6): the crop is a 6 x 6 window copied exactly. Replay
  // the documented draws on a copy to know where: photo, side, y0 = below(1), x0 = below(5), flip.
  for (uint64_t seed = 0; seed < 6; ++seed) {
    Rng rng(seed), replay(seed);
    replay.below(1);
    replay.uniform();
    replay.below(1);
    const int x0 = replay.below(5);
    const bool flipped = replay.below(2) == 1;
    std::vector<float> out(3 * 36);
    sample_photo_crop(one, rng, 6, 1.0f, true, out.data());
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 6; ++y)
        for (int x = 0; x < 6; ++x) {
          const int sx = x0 + (flipped ? 5 - x : x);
          REQUIRE(out[static_cast<size_t>((c * 6 + y) * 6 + x)] == one.photos[0][static_cast<size_t>((c * 6 + y) * 10 + sx)]);
        }
    CHECK(rng.s[0] == replay.s[0]);  // exactly those draws, no more
  }

  // Real photos: values in [0, 1], the same seed gives the same crops, another seed others.
  const PhotoCorpus corpus = load_photo_corpus(default_photo_dir(), 96, nullptr);
  const int side = 16;
  std::vector<float> a(static_cast<size_t>(3 * side * side * 20)), b(a.size()), c(a.size());
  Rng ra(11), rb(11), rc(12);
  for (int i = 0; i < 20; ++i) {
    sample_photo_crop(corpus, ra, side, 0.25f, true, a.data() + i * 3 * side * side);
    sample_photo_crop(corpus, rb, side, 0.25f, true, b.data() + i * 3 * side * side);
    sample_photo_crop(corpus, rc, side, 0.25f, true, c.data() + i * 3 * side * side);
  }
  CHECK(a == b);
  CHECK(a != c);
  for (float v : a) REQUIRE((v >= 0.0f && v <= 1.0f));
  // Upscaling a small crop (min_scale small, out_size large) stays in [0, 1] too.
  std::vector<float> big(3 * 200 * 200);
  Rng rbig(4);
  for (int i = 0; i < 5; ++i) {
    sample_photo_crop(corpus, rbig, 200, 0.05f, false, big.data());
    for (float v : big) REQUIRE((v >= 0.0f && v <= 1.0f));
  }
  CHECK_THROWS_WITH(sample_photo_crop(corpus, rbig, 0, 0.5f, false, big.data()), Catch::Contains("output size"));
  CHECK_THROWS_WITH(sample_photo_crop(corpus, rbig, 8, 0.0f, false, big.data()), Catch::Contains("minimum scale"));
  CHECK_THROWS_WITH(sample_photo_crop(PhotoCorpus{}, rbig, 8, 0.5f, false, big.data()), Catch::Contains("empty"));
}

TEST_CASE("centre_crop_photo: the centred square of the short side, exact and area-averaged", "[dataset][photos]") {
  // A wide 6 x 10 photo and a tall 10 x 6 one, value = (c * 100 + y * 10 + x) / 1000 (y, x in the
  // photo's own frame).
  PhotoCorpus two;
  two.source = "synthetic";
  two.heights = {6, 10};
  two.widths = {10, 6};
  two.names = {"wide", "tall"};
  for (int i = 0; i < 2; ++i) {
    const int h = two.heights[static_cast<size_t>(i)], w = two.widths[static_cast<size_t>(i)];
    two.photos.emplace_back(static_cast<size_t>(3 * h * w));
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
          two.photos.back()[static_cast<size_t>((c * h + y) * w + x)] = (c * 100 + y * 10 + x) / 1000.0f;
  }
  auto at = [&](int i, int c, int y, int x) {
    const int h = two.heights[static_cast<size_t>(i)], w = two.widths[static_cast<size_t>(i)];
    return two.photos[static_cast<size_t>(i)][static_cast<size_t>((c * h + y) * w + x)];
  };
  // Output = short side: the 6 x 6 window at (y0, x0) = (0, 2) of the wide photo, (2, 0) of the tall one.
  std::vector<float> out(3 * 36);
  for (int i = 0; i < 2; ++i) {
    centre_crop_photo(two, i, 6, out.data());
    const int y0 = i == 0 ? 0 : 2, x0 = i == 0 ? 2 : 0;
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 6; ++y)
        for (int x = 0; x < 6; ++x) REQUIRE(out[static_cast<size_t>((c * 6 + y) * 6 + x)] == at(i, c, y0 + y, x0 + x));
  }
  // Half the size: area interpolation at factor 2 is the mean of each 2 x 2 block (tolerance 1e-6).
  std::vector<float> half(3 * 9);
  centre_crop_photo(two, 0, 3, half.data());
  double worst = 0.0;
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 3; ++x) {
        const float mean = (at(0, c, 2 * y, 2 + 2 * x) + at(0, c, 2 * y, 3 + 2 * x) + at(0, c, 2 * y + 1, 2 + 2 * x) +
                            at(0, c, 2 * y + 1, 3 + 2 * x)) / 4.0f;
        worst = std::max(worst, static_cast<double>(std::abs(half[static_cast<size_t>((c * 3 + y) * 3 + x)] - mean)));
      }
  INFO("largest difference " << worst);
  CHECK(worst <= 1e-6);
  CHECK_THROWS_WITH(centre_crop_photo(two, 2, 6, out.data()), Catch::Contains("photo 2 is not in the corpus"));
  CHECK_THROWS_WITH(centre_crop_photo(two, 0, 0, out.data()), Catch::Contains("output size"));
}

TEST_CASE("photo run data: photos[:DIR], the limit and the held-out split as `vitlens train` reads them", "[dataset][photos]") {
  CHECK(is_photo_data("photos"));
  CHECK(is_photo_data("photos:/x"));
  CHECK_FALSE(is_photo_data("photo"));
  CHECK_FALSE(is_photo_data("fashion-mnist"));
  CHECK(photo_data_dir("photos") == default_photo_dir());
  CHECK(photo_data_dir("photos:") == default_photo_dir());
  CHECK(photo_data_dir("photos:/x/y") == "/x/y");

  const std::string dir = test::photo_folder("photo-run-data");
  // Six readable photos (one in a subfolder) and notes.txt, skipped and counted.
  const PhotoRunData all = load_photo_run_data("photos:" + dir, 16, 0, 0.0, 1);
  CHECK(all.dir == dir);
  CHECK(all.train.size() == 6);
  CHECK(all.val.size() == 0);
  CHECK(all.report.skipped == 1);
  // The long side is capped at max(4 x 16, 64) = 64.
  for (int i = 0; i < all.train.size(); ++i)
    CHECK(std::max(all.train.heights[static_cast<size_t>(i)], all.train.widths[static_cast<size_t>(i)]) <= 64);
  // limit 5 keeps the first five by path (messi5 in sub/ is last), 0.1 of 5 rounds to 1 held out,
  // the same split split_photos makes with the same seed.
  const PhotoRunData five = load_photo_run_data("photos:" + dir, 16, 5, 0.1, 7);
  CHECK(five.train.size() == 4);
  CHECK(five.val.size() == 1);
  std::vector<std::string> names = five.train.names;
  names.insert(names.end(), five.val.names.begin(), five.val.names.end());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"baboon.jpg", "building.jpg", "butterfly.jpg", "fruits.jpg", "home.jpg"});
  PhotoCorpus first5 = all.train, train, val;
  first5.photos.resize(5);
  first5.heights.resize(5);
  first5.widths.resize(5);
  first5.names.resize(5);
  split_photos(first5, 0.1, 7, &train, &val);
  CHECK(val.names == five.val.names);
  CHECK(val.photos == five.val.photos);

  CHECK_THROWS_WITH(load_photo_run_data("photos:" + dir + "/nowhere", 16, 0, 0.1, 0), Catch::Contains("no such folder"));
  CHECK_THROWS_WITH(load_photo_run_data("photos:" + dir, 16, 0, 1.0, 0), Catch::Contains("not in [0, 1)"));
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// Walking data folders with links: every walk runs in a forked child with a time and memory
// limit, so a walk that loops or grows again fails here instead of hanging the machine.
// ---------------------------------------------------------------------------------------------

namespace {

// A line of /proc/self/status ("VmRSS", "VmHWM") in kB.
long status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(std::string(key) + ":", 0) == 0) return std::stol(line.substr(line.find(':') + 1));
  return -1;
}

// The result line `work` returns, computed in a forked child that SIGALRM ends after 60 s and, in
// a build without a sanitizer (their allocators reserve terabytes), an address-space limit of
// 1 GiB above what this process maps. "error: ..." when it threw vitlens::Error, "signal N" when
// a limit ended it. With `growth_mb`, how far the child's resident memory rose above what it
// started with: its peak (VmHWM) is reset to the start (clear_refs 5) before `work` runs.
std::string in_bounded_child(const std::function<std::string()>& work, bool drop_root = false, long* growth_mb = nullptr) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::alarm(60);
#ifndef VITLENS_TEST_SANITIZER_ALLOCATOR
    long pages = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    const rlim_t cap = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (rlim_t{1} << 30);
    const rlimit as{cap, cap};
    ::setrlimit(RLIMIT_AS, &as);
#endif
    // root reads every folder whatever its mode: an unreadable folder needs another user.
    if (drop_root && ::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    std::ofstream("/proc/self/clear_refs") << "5";
    const long start_kb = status_kb("VmRSS");
    std::string result;
    try {
      result = work();
    } catch (const Error& e) {
      result = std::string("error: ") + e.what();
    } catch (const std::bad_alloc&) {
      result = "out of memory";
    }
    result += "\n" + std::to_string((status_kb("VmHWM") - start_kb) / 1024);
    const char* p = result.data();
    size_t left = result.size();
    while (left > 0) {
      const ssize_t n = ::write(fds[1], p, left);
      if (n <= 0) ::_exit(2);
      p += n;
      left -= static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "exit " + std::to_string(WEXITSTATUS(status));
  const size_t newline = out.rfind('\n');
  if (growth_mb) *growth_mb = std::stol(out.substr(newline + 1));
  return out.substr(0, newline);
}

void tiny_png(const std::string& path, int value) {
  REQUIRE(cv::imwrite(path, cv::Mat(4, 4, CV_8UC3, cv::Scalar(value, value, value))));
}

void link_to(const std::string& target, const std::string& link) {
  std::error_code ec;
  fs::create_symlink(target, link, ec);
  REQUIRE(!ec);
}

// An ImageFolder D with classes a (2 images) and b (1 image); `arrange` adds links to it.
std::string two_classes(const std::string& tag) {
  const std::string d = test::temp_dir(tag);
  fs::create_directories(d + "/a");
  fs::create_directories(d + "/b");
  tiny_png(d + "/a/1.png", 10);
  tiny_png(d + "/a/2.png", 20);
  tiny_png(d + "/b/1.png", 30);
  return d;
}

// "images per class; skipped; links outside" of load_image_folder in a bounded child.
std::string folder_summary(const std::string& d) {
  return in_bounded_child([&] {
    FolderReport report;
    const ImageSet s = load_image_folder(d, 4, &report);
    std::vector<int> per_class(static_cast<size_t>(s.num_classes()), 0);
    for (int32_t l : s.labels) ++per_class[static_cast<size_t>(l)];
    std::string out;
    for (int c : per_class) out += std::to_string(c) + " ";
    out += "skipped " + std::to_string(report.skipped) + " outside " + std::to_string(report.links_outside);
    if (report.links_outside > 0) out += " | " + links_outside_warning(report);
    for (const std::string& e : report.examples) out += " | " + e;
    return out;
  });
}

}  // namespace

TEST_CASE("data folder walk: links neither loop, nor repeat files, nor leave the data folder", "[dataset][folder][links]") {
  const std::string d = two_classes("links");
  SECTION("one self-link: each image once") {
    link_to(".", d + "/a/l1");
    CHECK(folder_summary(d) == "2 1 skipped 0 outside 0");
  }
  SECTION("the data folder named through a link, with a self-link inside: read as the folder itself") {
    link_to(".", d + "/a/l1");
    const std::string via = d + "-via";
    link_to(d, via);
    CHECK(folder_summary(via) == "2 1 skipped 0 outside 0");
    fs::remove(via);
  }
  SECTION("two self-links: ends, each image once") {
    link_to(".", d + "/a/l1");
    link_to(".", d + "/a/l2");
    CHECK(folder_summary(d) == "2 1 skipped 0 outside 0");
  }
  SECTION("a loop through a parent link: ends, each image once") {
    fs::create_directories(d + "/a/sub");
    tiny_png(d + "/a/sub/3.png", 40);
    link_to("..", d + "/a/sub/up");        // a/sub -> a: read already
    link_to("../..", d + "/a/sub/top");   // a/sub -> D: outside class a, not followed
    const std::string got = folder_summary(d);
    CHECK_THAT(got, Catch::StartsWith("3 1 skipped 0 outside 1 | not following 1 link to a folder outside"));
    CHECK_THAT(got, Catch::Contains(d + "/a/sub/top: a link to " + fs::canonical(d).string() + ", outside " + d + "/a"));
  }
  SECTION("a link to /: not followed, one warning") {
    link_to("/", d + "/a/root");
    const std::string got = folder_summary(d);
    CHECK_THAT(got, Catch::StartsWith("2 1 skipped 0 outside 1 | "));
    CHECK_THAT(got, Catch::Contains(d + "/a/root: a link to /, outside " + d + "/a"));
    CHECK(got.find('\n') == std::string::npos);
  }
  SECTION("a link to a folder outside the data folder, or to another class: not followed") {
    const std::string elsewhere = test::temp_dir("elsewhere");
    tiny_png(elsewhere + "/x.png", 50);
    tiny_png(elsewhere + "/y.png", 60);
    link_to(elsewhere, d + "/a/more");
    link_to("../b", d + "/a/b_too");
    CHECK_THAT(folder_summary(d), Catch::StartsWith("2 1 skipped 0 outside 2 | not following 2 links"));
    fs::remove_all(elsewhere);
  }
  SECTION("a link to a file outside is read; a file reached twice counts once") {
    const std::string elsewhere = test::temp_dir("elsewhere-file");
    tiny_png(elsewhere + "/x.png", 50);
    link_to(elsewhere + "/x.png", d + "/a/x.png");
    link_to("1.png", d + "/a/again.png");                      // a/1.png a second time
    fs::create_hard_link(d + "/a/2.png", d + "/a/hard.png");  // a/2.png a third time
    link_to(elsewhere + "/x.png", d + "/b/x.png");             // in another class: counted there too
    CHECK(folder_summary(d) == "3 2 skipped 0 outside 0");
    fs::remove_all(elsewhere);
  }
  SECTION("class folders that are links: inside the data folder read, outside not") {
    link_to("a", d + "/c");
    const std::string elsewhere = test::temp_dir("elsewhere-class");
    tiny_png(elsewhere + "/x.png", 50);
    link_to(elsewhere, d + "/d");
    CHECK_THAT(folder_summary(d), Catch::StartsWith("2 1 2 skipped 0 outside 1 | not following 1 link"));
    fs::remove_all(elsewhere);
  }
  SECTION("broken links, a loop of links and a pipe: skipped, each named in one line") {
    link_to("nowhere.png", d + "/a/broken.png");
    link_to("loop.png", d + "/a/loop.png");
    REQUIRE(::mkfifo((d + "/b/pipe.png").c_str(), 0644) == 0);
    const std::string got = folder_summary(d);
    CHECK_THAT(got, Catch::StartsWith("2 1 skipped 3 outside 0"));
    CHECK_THAT(got, Catch::Contains(d + "/a/broken.png: a broken link"));
    CHECK_THAT(got, Catch::Contains(d + "/a/loop.png: a link in a loop of links"));
    CHECK_THAT(got, Catch::Contains(d + "/b/pipe.png: not a regular file"));
  }
  SECTION("an unreadable folder: skipped and named; the data folder itself: one-line error") {
    REQUIRE(::chmod(d.c_str(), 0755) == 0);  // the other user reads the rest
    fs::create_directories(d + "/a/locked");
    tiny_png(d + "/a/locked/3.png", 40);
    REQUIRE(::chmod((d + "/a/locked").c_str(), 0) == 0);
    std::string got = in_bounded_child(
        [&] {
          FolderReport report;
          const ImageSet s = load_image_folder(d, 4, &report);
          return std::to_string(s.size()) + " " + report.examples.at(0);
        },
        true);
    CHECK(got == "3 " + d + "/a/locked: cannot read the folder (Permission denied)");
    REQUIRE(::chmod(d.c_str(), 0) == 0);
    got = in_bounded_child([&] { return std::to_string(load_photo_corpus(d, 8, nullptr).size()); }, true);
    CHECK(got == "error: " + d + ": cannot read the folder (Permission denied)");
    REQUIRE(::chmod(d.c_str(), 0700) == 0);
    REQUIRE(::chmod((d + "/a/locked").c_str(), 0700) == 0);
  }
  fs::remove_all(d);
}

TEST_CASE("data folder walk: photos:DIR walks the same way", "[dataset][photos][links]") {
  const std::string d = test::temp_dir("photo-links");
  fs::create_directories(d + "/sub");
  tiny_png(d + "/1.png", 10);
  tiny_png(d + "/sub/2.png", 20);
  link_to(".", d + "/self1");
  link_to(".", d + "/self2");
  link_to("..", d + "/sub/up");
  link_to("/", d + "/sub/root");
  link_to("1.png", d + "/sub/same.png");
  const std::string got = in_bounded_child([&] {
    FolderReport report;
    const PhotoCorpus corpus = load_photo_corpus(d, 8, &report);
    std::string out;
    for (const std::string& name : corpus.names) out += name + " ";
    return out + "outside " + std::to_string(report.links_outside);
  });
  CHECK(got == "1.png sub/2.png outside 1");
  fs::remove_all(d);
}

TEST_CASE("data folder walk: at most the given number of entries, then one line naming the limit", "[dataset][folder][links]") {
  const std::string d = test::temp_dir("walk-limit");
  for (int i = 0; i < 30; ++i) std::ofstream(d + "/f" + std::to_string(i) + ".png") << "x";
  CHECK(in_bounded_child([&] {
          DataWalker walker(d, 100);
          const size_t files = walker.walk(d, true).files.size();
          return std::to_string(files) + " " + std::to_string(walker.entries_read());
        }) == "30 30");
  // The limit holds for every walk of one load together (the classes of an ImageFolder).
  const std::string got = in_bounded_child([&] {
    DataWalker walker(d, 50);
    walker.walk(d, true);
    walker.walk(d, true);
    return std::string("no error");
  });
  CHECK(got == "error: " + d + ": holds more than 50 files and folders, the most vitlens reads from one data folder (stopped in " + d + ")");
  fs::remove_all(d);
}

TEST_CASE("IDX files that claim or inflate to gigabytes cost no more than their header allows", "[dataset][fashion][hostile]") {
  const std::string dir = test::temp_dir("idx-bomb");
  write_bytes(dir + "/t10k-labels-idx1-ubyte", tiny_labels());
  auto gzip_of = [](const std::string& raw) {
    z_stream zs{};
    REQUIRE(deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    std::string out(deflateBound(&zs, static_cast<uLong>(raw.size())), '\0');
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
    zs.avail_in = static_cast<uInt>(raw.size());
    zs.next_out = reinterpret_cast<Bytef*>(&out[0]);
    zs.avail_out = static_cast<uInt>(out.size());
    REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
    out.resize(zs.total_out);
    deflateEnd(&zs);
    return out;
  };
  auto load = [&](long* growth_mb) {
    return in_bounded_child([&] { return std::to_string(load_fashion_mnist(dir, false).size()); }, false, growth_mb);
  };
  long growth_mb = 0;
  SECTION("a 1 MB gzip that inflates to 1 GiB behind a header of 60000 images: stops at the header's 47 MB") {
    // 16 gzip members of 64 MiB of zeros each (gzip reads concatenated members as one stream).
    const std::string zeros_member = gzip_of(std::string(size_t{64} << 20, '\0'));
    std::string bomb = gzip_of(idx_bytes({60000, 28, 28}, {}));
    for (int i = 0; i < 16; ++i) bomb += zeros_member;
    REQUIRE(bomb.size() < (size_t{2} << 20));
    write_bytes(dir + "/t10k-images-idx3-ubyte.gz", bomb);
    const std::string got = load(&growth_mb);
    CHECK_THAT(got, Catch::StartsWith("error: " + dir + "/t10k-images-idx3-ubyte.gz: malformed IDX file (more bytes after the 47040000"));
    CHECK(got.find('\n') == std::string::npos);
    CHECK(growth_mb < 100);  // the 47 MB the header announces, the 1 MB file, no more
  }
  SECTION("a header that claims gigabytes: refused before inflating") {
    write_bytes(dir + "/t10k-images-idx3-ubyte.gz", gzip_of(idx_bytes({1u << 30, 28, 28}, {})));
    const std::string got = load(&growth_mb);
    CHECK_THAT(got, Catch::StartsWith("error: " + dir + "/t10k-images-idx3-ubyte.gz: IDX header announces more than 64 MiB"));
    CHECK(growth_mb < 16);
  }
  SECTION("a header of 2 images with 1 GiB of data behind it: stops after the 2 images") {
    const std::string zeros_member = gzip_of(std::string(size_t{64} << 20, '\0'));
    std::string bomb = gzip_of(idx_bytes({2, 28, 28}, std::vector<unsigned char>(2 * 28 * 28, 7)));
    for (int i = 0; i < 16; ++i) bomb += zeros_member;
    write_bytes(dir + "/t10k-images-idx3-ubyte.gz", bomb);
    write_bytes(dir + "/t10k-labels-idx1-ubyte", idx_bytes({2}, {1, 2}));
    CHECK_THAT(load(&growth_mb), Catch::Contains("more bytes after the 1568 data bytes"));
    CHECK(growth_mb < 16);
  }
  fs::remove_all(dir);
}

TEST_CASE("IDX files with any single bit flipped: a one-line error or a set that keeps its promises", "[dataset][fashion][hostile]") {
  const std::string dir = test::temp_dir("idx-flip");
  const std::string images = tiny_images(), labels = tiny_labels();
  int loaded = 0, refused = 0;
  for (int file = 0; file < 2; ++file) {
    const std::string& good = file == 0 ? images : labels;
    for (size_t at = 0; at < good.size(); ++at)
      for (int bit = 0; bit < 8; ++bit) {
        std::string bad = good;
        bad[at] = static_cast<char>(bad[at] ^ (1 << bit));
        write_bytes(dir + "/t10k-images-idx3-ubyte", file == 0 ? bad : images);
        write_bytes(dir + "/t10k-labels-idx1-ubyte", file == 1 ? bad : labels);
        try {
          const ImageSet s = load_fashion_mnist(dir, false);
          CHECK(s.pixels.size() == static_cast<size_t>(s.size()) * 3 * s.height * s.width);
          ++loaded;
        } catch (const Error& e) {
          CHECK(std::string(e.what()).find('\n') == std::string::npos);
          ++refused;
        }
      }
  }
  CHECK(loaded > 0);    // flips in the pixels still load
  CHECK(refused > 0);   // flips in the headers do not
  fs::remove_all(dir);
}

TEST_CASE("a classifier run's data: evaluation on the test set, or a seeded held-out split", "[dataset][fashion]") {
  // The one loader `vitlens train` and the viewer's Train window both use.
  const LabelledData plain = load_labelled_data("fashion-mnist", 28, 50, 0.0, 7, true);
  CHECK(plain.eval_name == "test");
  CHECK(plain.train.size() == 50);
  CHECK(plain.eval.size() == 50);
  CHECK(plain.test.size() == 0);
  CHECK(plain.eval.source == load_fashion_mnist(default_fashion_mnist_dir(), false, 50).source);

  const LabelledData held = load_labelled_data("fashion-mnist", 28, 50, 0.2, 7, true);
  CHECK(held.eval_name == "val");
  CHECK(held.train.size() + held.eval.size() == 50);
  CHECK(held.eval.size() >= 10);
  CHECK(held.test.size() == 50);  // kept aside for the final test accuracy
  const LabelledData again = load_labelled_data("fashion-mnist", 28, 50, 0.2, 7, false);
  CHECK(again.test.size() == 0);
  CHECK(again.train.labels == held.train.labels);  // same seed, same split
  CHECK(again.eval.pixels == held.eval.pixels);

  // A folder: trimmed to the limit, no evaluation set without a split, its left-out files reported.
  const std::string root = test::temp_dir("labelled");
  for (const char* c : {"a", "b"}) {
    fs::create_directory(root + "/" + c);
    for (int i = 0; i < 4; ++i)
      REQUIRE(cv::imwrite(root + "/" + c + "/" + std::to_string(i) + ".png", cv::Mat(6, 6, CV_8UC3, cv::Scalar(40 * i, 0, 0))));
  }
  write_bytes(root + "/b/broken.png", "not a png");
  const LabelledData folder = load_labelled_data(root, 4, 6, 0.0, 7, true);
  CHECK(folder.train.size() == 6);
  CHECK(folder.eval_name.empty());
  CHECK(folder.eval.size() == 0);
  CHECK(folder.report.skipped == 1);
  const LabelledData split = load_labelled_data(root, 4, 0, 0.25, 7, true);
  CHECK(split.eval_name == "val");
  CHECK(split.eval.size() == 2);  // one of each class's four
  CHECK(split.train.size() == 6);
  CHECK(split.test.size() == 0);

  CHECK_THROWS_WITH(load_labelled_data("/no/such/folder", 28, 0, 0.0, 7, true),
                    Catch::Contains("/no/such/folder") && Catch::Contains("neither 'fashion-mnist', a folder"));
}
