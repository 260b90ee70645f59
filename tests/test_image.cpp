// Images as users give them: every format converted, every bad file refused in one line.
#include <catch2/catch.hpp>

#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

#include <opencv2/imgcodecs.hpp>

#include "test_support.hpp"
#include "core/base/error.hpp"
#include "core/io/files.hpp"  // read_whole_file
#include "core/io/image.hpp"

using namespace vitlens;

namespace {

std::string write_bytes(const std::string& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

}  // namespace

TEST_CASE("grayscale, 16-bit and RGBA images load as RGB in [0, 1]", "[image]") {
  const std::string dir = test::temp_dir("img");
  cv::Mat gray(5, 6, CV_8UC1, cv::Scalar(51));
  REQUIRE(cv::imwrite(dir + "/gray.png", gray));
  cv::Mat g = load_image_rgb(dir + "/gray.png");
  REQUIRE(g.type() == CV_32FC3);
  CHECK(g.at<cv::Vec3f>(2, 3)[0] == Approx(0.2f));
  CHECK(g.at<cv::Vec3f>(2, 3)[2] == Approx(0.2f));

  cv::Mat deep(4, 4, CV_16UC3, cv::Scalar(0, 32768, 65535));  // BGR order in OpenCV
  REQUIRE(cv::imwrite(dir + "/deep.png", deep));
  cv::Mat d = load_image_rgb(dir + "/deep.png");
  CHECK(d.at<cv::Vec3f>(0, 0)[0] == Approx(1.0f));          // R
  CHECK(d.at<cv::Vec3f>(0, 0)[1] == Approx(0.5f).margin(1e-4));
  CHECK(d.at<cv::Vec3f>(0, 0)[2] == Approx(0.0f));          // B

  cv::Mat rgba(4, 4, CV_8UC4, cv::Scalar(255, 0, 0, 10));  // B=255, alpha 10: alpha dropped
  REQUIRE(cv::imwrite(dir + "/rgba.png", rgba));
  cv::Mat a = load_image_rgb(dir + "/rgba.png");
  CHECK(a.at<cv::Vec3f>(1, 1)[2] == Approx(1.0f));
  CHECK(a.at<cv::Vec3f>(1, 1)[0] == Approx(0.0f));

}

TEST_CASE("bad image files give one clear error naming the file", "[image][errors]") {
  const std::string dir = test::temp_dir("badimg");
  CHECK_THROWS_WITH(load_image_rgb(dir + "/missing.png"), Catch::Contains("missing.png") && Catch::Contains("no such file"));
  CHECK_THROWS_WITH(load_image_rgb(write_bytes(dir, "empty.png", "")), Catch::Contains("empty.png") && Catch::Contains("empty"));
  CHECK_THROWS_WITH(load_image_rgb(write_bytes(dir, "text.jpg", "this is not an image\n")),
                    Catch::Contains("text.jpg") && Catch::Contains("not an image"));
  // A PNG cut in half.
  cv::Mat img(64, 64, CV_8UC3, cv::Scalar(1, 2, 3));
  cv::randu(img, 0, 255);
  std::vector<unsigned char> png;
  REQUIRE(cv::imencode(".png", img, png));
  CHECK_THROWS_AS(load_image_rgb(write_bytes(dir, "cut.png", std::string(png.begin(), png.begin() + png.size() / 2))), Error);
  CHECK_THROWS_WITH(load_image_rgb(dir), Catch::Contains(dir) && Catch::Contains("is a folder"));
}

TEST_CASE("a path that cannot be opened says why: link loop, permission, pipe, device, not a folder", "[image][errors]") {
  const std::string dir = test::temp_dir("openerr");
  // A loop of symbolic links: stat fails with ELOOP, not ENOENT.
  REQUIRE(::symlink("loop_b.png", (dir + "/loop_a.png").c_str()) == 0);
  REQUIRE(::symlink("loop_a.png", (dir + "/loop_b.png").c_str()) == 0);
  CHECK_THROWS_WITH(load_image_rgb(dir + "/loop_a.png"),
                    Catch::Contains("loop_a.png") && Catch::Contains("loop of symbolic links") &&
                        !Catch::Contains("no such file"));
  // A link to nothing is a missing file.
  REQUIRE(::symlink("nowhere.png", (dir + "/dangling.png").c_str()) == 0);
  CHECK_THROWS_WITH(load_image_rgb(dir + "/dangling.png"), Catch::Contains("no such file"));
  // A file used as a folder.
  const std::string file = write_bytes(dir, "file.png", "x");
  CHECK_THROWS_WITH(load_image_rgb(file + "/inside.png"), Catch::Contains("a part of the path is not a folder"));
  // A pipe is refused from stat, before any open that would wait for a writer (the test would hang).
  REQUIRE(::mkfifo((dir + "/pipe.png").c_str(), 0644) == 0);
  CHECK_THROWS_WITH(load_image_rgb(dir + "/pipe.png"), Catch::Contains("pipe.png") && Catch::Contains("is a pipe (FIFO)"));
  CHECK_THROWS_WITH(load_image_rgb("/dev/null"), Catch::Contains("/dev/null") && Catch::Contains("is a device"));
  // The same reader opens model files: its words name the kind of file expected.
  CHECK_THROWS_WITH(read_whole_file(dir + "/pipe.png", "a model file", 100), Catch::Contains("a model file was expected"));
  // Permission: a folder that cannot be searched makes stat fail with EACCES (root is never refused).
  ::mkdir((dir + "/closed").c_str(), 0755);
  write_bytes(dir + "/closed", "a.png", "x");
  REQUIRE(::chmod((dir + "/closed").c_str(), 0) == 0);
  if (::geteuid() != 0) {
    CHECK_THROWS_WITH(load_image_rgb(dir + "/closed/a.png"),
                      Catch::Contains("permission denied") && !Catch::Contains("no such file"));
  } else {
    WARN("running as root: the permission case cannot be made here");
  }
  ::chmod((dir + "/closed").c_str(), 0755);
}

TEST_CASE("size policy: never resample the model size, downscale large, pad to whole patches", "[image]") {
  const VitConfig c = test::small_config(16);
  cv::Mat exact(16, 16, CV_32FC3);
  cv::randu(exact, 0.0f, 1.0f);
  const PreparedImage same = prepare_image(exact, c, 8);  // even a smaller max_side leaves it alone
  CHECK_FALSE(same.resized);
  CHECK(cv::norm(same.rgb, exact, cv::NORM_INF) == 0.0);

  cv::Mat wide(30, 60, CV_32FC3, cv::Scalar(0.5f, 0.5f, 0.5f));
  const PreparedImage down = prepare_image(wide, c, 20);
  CHECK(down.resized);
  CHECK(down.content_w == 20);
  CHECK(down.content_h == 10);
  CHECK(down.padded_h == 12);
  CHECK(down.grid.grid_w == 5);
  CHECK(down.grid.grid_h == 3);
  const PreparedImage native = prepare_image(wide, c, 0);
  CHECK_FALSE(native.resized);
  CHECK(native.padded_w == 60);
  CHECK(native.padded_h == 32);

  cv::Mat tiny(3, 40, CV_32FC3, cv::Scalar(0, 0, 0));
  CHECK_THROWS_WITH(prepare_image(tiny, c, 0), Catch::Contains("smaller than one 4x4 patch"));
  cv::Mat sliver(5, 400, CV_32FC3, cv::Scalar(0, 0, 0));
  CHECK_THROWS_WITH(prepare_image(sliver, c, 100), Catch::Contains("thinner than one 4x4 patch"));
}

TEST_CASE("an image thinner than one patch is refused at every working size, with advice that works", "[image]") {
  const std::string dir = test::temp_dir("img-thin");
  auto message = [](const LoadedImage& image, const VitConfig& c, int max_side) {
    try {
      prepare_image(image, c, max_side, "strip.png");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto strip = [&](int w, int h) {
    cv::Mat pixels(h, w, CV_8UC3);
    cv::randu(pixels, 0, 255);
    const std::string path = dir + "/s" + std::to_string(w) + "x" + std::to_string(h) + ".png";
    REQUIRE(cv::imwrite(path, pixels));
    return load_image(path);  // as export loads it: at most kMaxLoadSide a side
  };
  const VitConfig p4 = test::small_config(16);  // 4x4 patches

  // 3000x5: the loader already reduces it to 2048x3, so no working size (--size 0 and 2048
  // included) gives a row of whole patches; the refusal does not send the user to --size.
  const LoadedImage s3000 = strip(3000, 5);
  for (int max_side : {1000, 0, 2048}) {
    INFO("max_side " << max_side);
    const std::string m = message(s3000, p4, max_side);
    CHECK_THAT(m, Catch::Contains("thinner than one 4x4 patch") && Catch::Contains("at any working size") &&
                      Catch::Contains("crop it"));
    CHECK_THAT(m, !Catch::Contains("--size"));
  }
  // 300x3 against 4x4 patches: smaller than a patch whatever the size.
  const LoadedImage s300 = strip(300, 3);
  for (int max_side : {100, 0, 300, 2048})
    CHECK_THAT(message(s300, p4, max_side), Catch::Contains("smaller than one 4x4 patch"));
  // Against 2x2 patches 300x3 fits at its native size; a small working size is refused, naming
  // the least size that works, and that size (and --size 0) does work.
  VitConfig p2 = test::small_config(16);
  p2.patch_size = 2;
  const std::string m = message(s300, p2, 100);
  CHECK_THAT(m, Catch::Contains("becomes 100x1 at working size 100") &&
                    Catch::Contains("at least 150 (vitlens export: --size 150, or --size 0 for the native size)"));
  CHECK_NOTHROW(prepare_image(s300, p2, 150));
  CHECK_THAT(message(s300, p2, 149), Catch::Contains("--size 150,"));
  const PreparedImage native = prepare_image(s300, p2, 0);
  CHECK(native.grid.grid_h == 2);
  CHECK(native.grid.grid_w == 150);
}

TEST_CASE("patchify flattens each patch channel-major (c, y, x) and normalises", "[image]") {
  VitConfig c = test::small_config(8);
  c.mean = {0.5f, 0.25f, 0.0f};
  c.std = {0.5f, 0.25f, 2.0f};
  cv::Mat img(8, 8, CV_32FC3);
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 8; ++x) img.at<cv::Vec3f>(y, x) = cv::Vec3f(x / 8.0f, y / 8.0f, (x + y) / 16.0f);
  const MatRM p = patchify(img, c);
  REQUIRE(p.rows() == 4);
  REQUIRE(p.cols() == 48);
  // Patch 3 is grid row 1, col 1: pixels x, y in [4, 8).
  for (int ch = 0; ch < 3; ++ch)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 4; ++x) {
        const cv::Vec3f px = img.at<cv::Vec3f>(4 + y, 4 + x);
        CHECK(p(3, ch * 16 + y * 4 + x) == Approx((px[ch] - c.mean[ch]) / c.std[ch]));
      }
}
