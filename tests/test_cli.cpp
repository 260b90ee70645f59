// `vitlens` end to end: exit codes, files, PNG sizes, npy shape and dtype, JSON fields, one-line
// errors, batches with a bad image, atomic writes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "process_support.hpp"
#include "test_support.hpp"
#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "core/render/heatmap.hpp"

using namespace vitlens;

namespace {

using Run = test::ShellRun;
using test::count_lines;
using test::slurp;

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// Runs the real binary with arguments (already shell-quoted where needed).
Run run(const std::string& args) {
  static const std::string dir = test::temp_dir("cli-run");
  return test::run_vitlens_shell(dir, args);
}

struct Fixture {
  std::string dir = test::temp_dir("cli");
  std::string model = dir + "/model.safetensors";
  std::string image = dir + "/photo.png";
  Fixture() {
    VitConfig c = test::small_config(16, true, 2);
    save_model(model, c, test::random_tensors(c, 17));
    cv::Mat img(18, 22, CV_8UC3);  // 22x18 at native size -> 24x20 padded, 6x5 patches
    cv::randu(img, 0, 255);
    REQUIRE(cv::imwrite(image, img));
  }
};

}  // namespace

TEST_CASE("cli: --help, --version, export --help", "[cli]") {
  Run v = run("--version");
  CHECK(v.code == 0);
  CHECK_THAT(v.out, Catch::Contains("vitlens " VITLENS_VERSION));
  Run h = run("--help");
  CHECK(h.code == 0);
  CHECK_THAT(h.out, Catch::Contains("export") && Catch::Contains("info"));
  Run eh = run("export --help");
  CHECK(eh.code == 0);
  for (const char* flag : {"--model", "--out", "--query", "--patch", "--cls", "--received", "--layer", "--mask",
                           "--colormap", "--alpha", "--upsample", "--raw", "--size"})
    CHECK_THAT(eh.out, Catch::Contains(flag));
}

TEST_CASE("cli: export writes every head, the mean, the montage, JSON and raw npy", "[cli]") {
  Fixture f;
  Run r = run("export " + f.image + " --model " + f.model + " --out " + f.dir + " --size 0 --raw --patch 2,3 --colormap inferno");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  for (int h = 0; h < 4; ++h) {
    const cv::Mat png = cv::imread(f.dir + "/photo_head" + std::to_string(h) + ".png", cv::IMREAD_UNCHANGED);
    REQUIRE_FALSE(png.empty());
    // The processed image (22x18 padded to 24x20) enlarged to the montage's smallest tile, with the
    // head's label above it and the colour bar and caption below.
    CHECK(png.cols >= kMinMontageTile);
    CHECK(png.rows > kMinMontageTile * 20 / 24);
    CHECK(png.channels() == 3);
  }
  CHECK(exists(f.dir + "/photo_mean.png"));
  CHECK_FALSE(cv::imread(f.dir + "/photo_montage.png").empty());

  // npy: float32 (layers, heads, tokens, tokens), tokens = 1 + 6*5
  const std::string npy = slurp(f.dir + "/photo_attn.npy");
  REQUIRE(npy.size() > 10);
  CHECK(npy.substr(0, 6) == "\x93NUMPY");
  const size_t header_len = static_cast<unsigned char>(npy[8]) | (static_cast<unsigned char>(npy[9]) << 8);
  const std::string header = npy.substr(10, header_len);
  CHECK_THAT(header, Catch::Contains("'descr': '<f4'") && Catch::Contains("'shape': (2, 4, 31, 31)"));
  CHECK((10 + header_len) % 64 == 0);
  REQUIRE(npy.size() == 10 + header_len + 2 * 4 * 31 * 31 * 4);
  // Every row of every matrix sums to 1, and padded keys get nothing.
  const float* probs = reinterpret_cast<const float*>(npy.data() + 10 + header_len);
  for (int m = 0; m < 2 * 4; ++m)
    for (int i = 0; i < 31; ++i) {
      double s = 0.0;
      for (int j = 0; j < 31; ++j) s += probs[(m * 31 + i) * 31 + j];
      CHECK(s == Approx(1.0).epsilon(1e-5));
      CHECK(probs[(m * 31 + i) * 31 + 1 + 5] == 0.0f);  // patch (0, 5) holds padded pixels
    }

  const auto j = nlohmann::json::parse(slurp(f.dir + "/photo.json"));
  CHECK(j["mode"] == "query");
  CHECK(j["query"]["patch"] == nlohmann::json({2, 3}));
  CHECK(j["query"]["token"] == 1 + 2 * 6 + 3);
  CHECK(j["tokens"] == 31);
  CHECK(j["layer"] == 1);
  CHECK(j["processed_size"] == nlohmann::json({24, 20}));
  CHECK(j["source_size"] == nlohmann::json({22, 18}));
  CHECK(j["colormap"] == "inferno");
  CHECK(j["mask"]["padding_patches"] == 10);
  REQUIRE(j["heads"].size() == 4);
  for (const auto& h : j["heads"]) {
    CHECK(h["max"].get<double>() >= h["min"].get<double>());
    CHECK(h["entropy"].get<double>() > 0.0);
    CHECK(h["sum"].get<double>() + h["class_token_weight"].get<double>() == Approx(1.0).epsilon(1e-5));
  }
  CHECK(j["timings_ms"]["forward"].get<double>() >= 0.0);
  CHECK(j["files"].size() == 7);
}

TEST_CASE("cli: modes, layers and their errors", "[cli]") {
  Fixture f;
  const std::string base = "export " + f.image + " --model " + f.model + " --out " + f.dir + " --size 0 ";
  CHECK(run(base + "--cls").code == 0);
  CHECK(nlohmann::json::parse(slurp(f.dir + "/photo.json"))["mode"] == "cls");
  CHECK(run(base + "--query 9,13 --layer 0 --mask causal --upsample bilinear --alpha 0.3").code == 0);
  const auto j = nlohmann::json::parse(slurp(f.dir + "/photo.json"));
  CHECK(j["query"]["patch"] == nlohmann::json({3, 2}));
  CHECK(j["mask"]["causal"] == true);
  CHECK(j["layer"] == 0);
  CHECK(run(base).code == 0);
  CHECK(nlohmann::json::parse(slurp(f.dir + "/photo.json"))["mode"] == "received");

  Run outside = run(base + "--patch 5,6");
  CHECK(outside.code == 1);
  CHECK_THAT(outside.err, Catch::Contains("outside the 5x6 patch grid"));
  Run layer = run(base + "--layer 2");  // past the model's depth: a usage error, before any work
  CHECK(layer.code == 2);
  CHECK_THAT(layer.err, Catch::Contains("--layer 2 is out of range"));
}

TEST_CASE("cli: bad flag values and bad inputs exit non-zero with one line on stderr", "[cli][errors]") {
  Fixture f;
  const std::string base = "export " + f.image + " --model " + f.model + " --out " + f.dir + " ";
  struct Case {
    std::string args;
    int code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"--alpha 2", 2, "--alpha"},
      {"--alpha nan", 2, "--alpha"},
      {"--colormap rainbowz", 2, "--colormap"},
      {"--mask future", 2, "--mask"},
      {"--upsample cubic", 2, "--upsample"},
      {"--layer -1", 2, "--layer"},
      {"--size -5", 2, "--size"},
      {"--query 3", 2, "--query expects two integers"},
      {"--patch a,b", 2, "--patch expects two integers"},
      {"--cls --received", 2, "excludes"},
      {"--bogus", 2, "--bogus"},
      {"--preprocess model", 2, "publishes no transform (a vitlens model"},
      {"--rollout --discard 0.99999999", 2, "rounds to 1 as a 32-bit float; the largest allowed is 0.99999994"},
  };
  for (const Case& c : cases) {
    Run r = run(base + c.args);
    INFO(c.args << " -> " << r.err);
    CHECK(r.code == c.code);
    CHECK(count_lines(r.err) == 1);
    CHECK_THAT(r.err, Catch::Contains(c.says));
  }
  Run file_as_dir = run("export " + f.image + " --model " + f.model + " --out " + f.image);
  CHECK(file_as_dir.code == 1);
  CHECK_THAT(file_as_dir.err, Catch::Contains("not a folder"));

  std::ofstream(f.dir + "/junk.safetensors") << "not a model at all";
  Run bad_model = run("export " + f.image + " --model " + f.dir + "/junk.safetensors --out " + f.dir);
  CHECK(bad_model.code == 1);
  CHECK(count_lines(bad_model.err) == 1);
  CHECK_THAT(bad_model.err, Catch::Contains("junk.safetensors"));

  cv::Mat tiny(3, 3, CV_8UC3, cv::Scalar(1, 2, 3));
  REQUIRE(cv::imwrite(f.dir + "/tiny.png", tiny));
  Run small = run("export " + f.dir + "/tiny.png --model " + f.model + " --out " + f.dir);
  CHECK(small.code == 1);
  CHECK_THAT(small.err, Catch::Contains("smaller than one 4x4 patch"));

  Run device = run("export /dev/zero --model " + f.model + " --out " + f.dir);
  CHECK(device.code == 1);
  CHECK_THAT(device.err, Catch::Contains("not a regular file"));

  cv::Mat huge(2100, 2100, CV_8UC3, cv::Scalar(9, 9, 9));
  REQUIRE(cv::imwrite(f.dir + "/huge.png", huge));
  Run too_many = run("export " + f.dir + "/huge.png --model " + f.model + " --out " + f.dir + " --size 0");
  CHECK(too_many.code == 1);
  CHECK(count_lines(too_many.err) == 1);
  CHECK_THAT(too_many.err, Catch::Contains("use a smaller --size"));

  // --raw above the token limit is refused before anything is written.
  cv::Mat big(300, 300, CV_8UC3, cv::Scalar(9, 9, 9));
  REQUIRE(cv::imwrite(f.dir + "/big.png", big));
  Run raw = run("export " + f.dir + "/big.png --model " + f.model + " --out " + f.dir + " --size 0 --raw");
  CHECK(raw.code == 1);
  CHECK_THAT(raw.err, Catch::Contains("--raw stores (layers, heads, N, N) floats and is limited to 4096 tokens"));
  CHECK_FALSE(exists(f.dir + "/big_head0.png"));
  // --rollout keeps the same weights, under the same limit, and says so in its own name.
  Run rollout = run("export " + f.dir + "/big.png --model " + f.model + " --out " + f.dir + " --size 0 --rollout");
  CHECK(rollout.code == 1);
  CHECK(count_lines(rollout.err) == 1);
  CHECK_THAT(rollout.err, Catch::Contains("--rollout multiplies every layer's (N, N) weights and is limited to 4096 tokens"));
  CHECK_FALSE(exists(f.dir + "/big_rollout.png"));
}

TEST_CASE("cli: an option given an empty value is refused, not taken as its default", "[cli][errors]") {
  Fixture f;
  const std::string out = f.dir + "/out";
  const std::string model = " --model " + f.model;
  // Each of these once ran as if the option were absent: the default query, the default model, a
  // new run instead of a resume.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"export " + f.image + model + " --out " + out + " --query ''", "--query: an empty value"},
      {"export " + f.image + model + " --out " + out + " --query-processed ''", "--query-processed: an empty value"},
      {"export " + f.image + model + " --out " + out + " --patch ''", "--patch: an empty value"},
      {"export " + f.image + model + " --out " + out + " --token ''", "--token: an empty value"},
      {"export " + f.image + " --model '' --out " + out, "--model: an empty value"},
      {"export ''" + model + " --out " + out, "IMAGE: an empty value"},
      {"info --model ''", "--model: an empty value"},
      {"train --data fashion-mnist --resume ''", "--resume: an empty value"},
      {"train --data fashion-mnist --out " + out + " --grad-dump ''", "--grad-dump: an empty value"},
      {"train --data fashion-mnist --out " + out + " --description ''", "--description: an empty value"},
      {"view --model '' --screenshot " + out + "/s.png", "--model: an empty value"},
  };
  for (const auto& [args, says] : cases) {
    Run r = run(args);
    INFO(args << " -> " << r.err);
    CHECK(r.code == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK_THAT(r.err, Catch::Contains(says));
    CHECK_FALSE(exists(out));
  }
}

TEST_CASE("cli: a message quoting a name shows bytes that are not printable UTF-8 as hex escapes", "[cli][errors]") {
  Fixture f;
  // An overlong '/', a UTF-16 surrogate, the C1 control CSI, a truncated character, then 'é' (kept).
  const std::string name = f.dir + "/a\xc0\xaf" "b\xed\xa0\x80" "c\xc2\x9b" "d\xc3" "e\xc3\xa9.png";
  Run r = run("export '" + name + "' --model " + f.model + " --out " + f.dir + "/out");
  INFO(r.err);
  CHECK(r.code == 1);
  CHECK(count_lines(r.err) == 1);
  CHECK_THAT(r.err, Catch::Contains("/a\\xc0\\xafb\\xed\\xa0\\x80c\\xc2\\x9bd\\xc3e\xc3\xa9.png: cannot open an image file"));
}

TEST_CASE("cli: a batch reports the bad image, exports the others and exits 1", "[cli]") {
  Fixture f;
  std::ofstream(f.dir + "/broken.jpg") << "GIF89a but not really";
  ::mkdir((f.dir + "/sub").c_str(), 0755);
  cv::Mat other(16, 16, CV_8UC3, cv::Scalar(200, 10, 10));
  REQUIRE(cv::imwrite(f.dir + "/sub/photo.png", other));  // same stem as the first image
  const std::string out = f.dir + "/out";
  ::mkdir(out.c_str(), 0755);
  Run r = run("export " + f.image + " " + f.dir + "/broken.jpg " + f.dir + "/sub/photo.png --model " + f.model + " --out " + out);
  CHECK(r.code == 1);
  CHECK_THAT(r.err, Catch::Contains("broken.jpg") && Catch::Contains("1 of 3 image(s) failed"));
  CHECK(count_lines(r.err) == 2);
  CHECK(exists(out + "/photo_montage.png"));
  CHECK(exists(out + "/photo_2_montage.png"));  // the second photo.png does not overwrite the first
  CHECK_FALSE(exists(out + "/broken_head0.png"));
}

TEST_CASE("cli: odd names and odd files in a batch do not stop it", "[cli]") {
  Fixture f;
  const std::string out = f.dir + "/odd";
  ::mkdir(out.c_str(), 0755);
  // A file name that is not UTF-8, one with spaces, and stems that collide with generated ones.
  const std::string latin1 = f.dir + "/caf\xe9.png", spaced = f.dir + "/with space.png";
  ::mkdir((f.dir + "/c1").c_str(), 0755);
  ::mkdir((f.dir + "/c2").c_str(), 0755);
  cv::Mat img(16, 16, CV_8UC3, cv::Scalar(30, 60, 90));
  for (const std::string& p : {latin1, spaced, f.dir + "/c1/x.png", f.dir + "/c2/x.png", f.dir + "/x_2.png"})
    REQUIRE(cv::imwrite(p, img));
  Run r = run("export '" + latin1 + "' '" + spaced + "' " + f.dir + "/c1/x.png " + f.dir + "/c2/x.png " + f.dir +
              "/x_2.png --model " + f.model + " --out " + out);
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(exists(out + "/caf\xe9.json"));
  CHECK(exists(out + "/with space_montage.png"));
  CHECK(exists(out + "/x.json"));
  CHECK(exists(out + "/x_2.json"));
  CHECK(exists(out + "/x_2_2.json"));  // the third input, x_2.png, does not overwrite the second x.png
  const auto j = nlohmann::json::parse(slurp(out + "/x_2_2.json"));
  CHECK_THAT(j["image"].get<std::string>(), Catch::EndsWith("/x_2.png"));
  CHECK(nlohmann::json::parse(slurp(out + "/x_2.json"))["image"].get<std::string>().find("/c2/x.png") != std::string::npos);

  // An input whose name is another input's output name is never overwritten.
  const std::string self = f.dir + "/self";
  ::mkdir(self.c_str(), 0755);
  REQUIRE(cv::imwrite(self + "/a.png", img));
  cv::Mat other(16, 16, CV_8UC3, cv::Scalar(1, 2, 3));
  REQUIRE(cv::imwrite(self + "/a_mean.png", other));
  const std::string before = slurp(self + "/a_mean.png");
  Run own = run("export " + self + "/a.png " + self + "/a_mean.png --model " + f.model + " --out " + self);
  CHECK(own.code == 0);
  CHECK(slurp(self + "/a_mean.png") == before);
  CHECK(exists(self + "/a_2_montage.png"));

  // An image far larger than its file (a 121-megapixel black PNG) is refused in one line; the
  // next image is still exported.
  cv::Mat huge(11000, 11000, CV_8UC1, cv::Scalar(0));
  REQUIRE(cv::imwrite(f.dir + "/bomb.png", huge));
  huge.release();
  Run bomb = run("export " + f.dir + "/bomb.png " + f.image + " --model " + f.model + " --out " + out);
  CHECK(bomb.code == 1);
  CHECK_THAT(bomb.err, Catch::Contains("bomb.png") && Catch::Contains("megapixels"));
  CHECK(count_lines(bomb.err) == 2);  // the image's line and the batch summary
  CHECK(exists(out + "/photo.json"));
}

TEST_CASE("cli: info describes the model", "[cli]") {
  Fixture f;
  Run r = run("info --model " + f.model);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("model:        test") && Catch::Contains("depth:        2") &&
                        Catch::Contains("heads:        4 of 12 dims"));
  const VitModel m = load_model(f.model);
  CHECK_THAT(r.out, Catch::Contains("parameters:   " + std::to_string(m.parameter_count())));
  Run missing = run("info --model " + f.dir + "/missing.safetensors");
  CHECK(missing.code == 1);
  CHECK(count_lines(missing.err) == 1);
}

TEST_CASE("atomic writes: a failed write leaves no temporary and no damaged file", "[files]") {
  const std::string dir = test::temp_dir("atomic");
  write_file_atomic(dir + "/a.txt", "first");
  write_file_atomic(dir + "/a.txt", "second");
  CHECK(slurp(dir + "/a.txt") == "second");
  // Renaming over a folder fails: the folder and its content survive, no temporary is left.
  ::mkdir((dir + "/folder").c_str(), 0755);
  write_file_atomic(dir + "/folder/keep.txt", "kept");
  CHECK_THROWS_WITH(write_file_atomic(dir + "/folder", "x"), Catch::Contains("nothing was written"));
  CHECK(slurp(dir + "/folder/keep.txt") == "kept");
  CHECK_THROWS_AS(write_file_atomic(dir + "/missing/b.txt", "x"), Error);
  int leftovers = 0;
  FILE* p = ::popen(("ls -A " + dir).c_str(), "r");
  REQUIRE(p);
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) leftovers += std::string(buf).find(".vitlens-") != std::string::npos;
  ::pclose(p);
  CHECK(leftovers == 0);
}

// [SECTION] Files vitlens did not write: never replaced, never deleted, never overwritten as inputs

namespace {

void spit(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string make_dir(const std::string& path) {
  ::mkdir(path.c_str(), 0755);
  return path;
}

// The visible files of a folder, sorted.
std::vector<std::string> visible_files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name[0] != '.') names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Expands the shell's "{A..B}" ranges of a name, as the export summary folds them.
std::vector<std::string> expand_ranges(const std::string& name) {
  const size_t open = name.find('{');
  if (open == std::string::npos) return {name};
  const size_t dots = name.find("..", open), close = name.find('}', open);
  REQUIRE(dots != std::string::npos);
  REQUIRE(close != std::string::npos);
  const int first = std::stoi(name.substr(open + 1, dots - open - 1)), last = std::stoi(name.substr(dots + 2, close - dots - 2));
  std::vector<std::string> out;
  for (int v = first; v <= last; ++v)
    for (const std::string& rest : expand_ranges(name.substr(close + 1)))
      out.push_back(name.substr(0, open) + std::to_string(v) + rest);
  return out;
}

}  // namespace

TEST_CASE("cli: export replaces or deletes only files vitlens wrote, --force replaces the others", "[cli][trust]") {
  Fixture f;
  const std::string dir = make_dir(f.dir + "/mine");
  cv::Mat img(16, 16, CV_8UC3, cv::Scalar(30, 60, 90));
  REQUIRE(cv::imwrite(dir + "/data.png", img));
  // A JSON of the record's name that vitlens did not write, listing a file of the user's.
  const std::string foreign = R"({"files":["data_notes.txt"]})";
  spit(dir + "/data.json", foreign);
  spit(dir + "/data_notes.txt", "my notes");
  const std::string export_data = "export " + dir + "/data.png --model " + f.model + " --out " + dir;
  Run refused = run(export_data);
  CHECK(refused.code == 1);
  CHECK(count_lines(refused.err) == 1);
  CHECK_THAT(refused.err, Catch::Contains(dir + "/data.json") && Catch::Contains("did not write") &&
                              Catch::Contains("--force"));
  CHECK(slurp(dir + "/data.json") == foreign);
  CHECK(slurp(dir + "/data_notes.txt") == "my notes");
  CHECK_FALSE(exists(dir + "/data_head0.png"));  // nothing of the set
  // --force replaces it; what a record vitlens did not write lists is still never deleted.
  Run forced = run(export_data + " --force");
  INFO(forced.err);
  CHECK(forced.code == 0);
  CHECK(slurp(dir + "/data_notes.txt") == "my notes");
  CHECK(nlohmann::json::parse(slurp(dir + "/data.json"))[kRecordKey] == "data.json");
  CHECK(run(export_data).code == 0);  // vitlens' own record now: replaced without --force

  // A LabelMe-style annotation beside its image.
  REQUIRE(cv::imwrite(dir + "/img001.png", img));
  const std::string labelme = R"({"version":"5.2.1","shapes":[{"label":"cat","points":[[1,2],[3,4]]}],"imagePath":"img001.png"})";
  spit(dir + "/img001.json", labelme);
  Run annotated = run("export " + dir + "/img001.png --model " + f.model + " --out " + dir);
  CHECK(annotated.code == 1);
  CHECK_THAT(annotated.err, Catch::Contains("img001.json"));
  CHECK(slurp(dir + "/img001.json") == labelme);

  // A picture of the user's with one output's name, and a renamed copy of a record of vitlens
  // (it names another file: a copy proves nothing).
  const std::string other = make_dir(f.dir + "/other");
  spit(other + "/photo_mean.png", "my picture");
  Run picture = run("export " + f.image + " --model " + f.model + " --out " + other);
  CHECK(picture.code == 1);
  CHECK_THAT(picture.err, Catch::Contains(other + "/photo_mean.png"));
  CHECK(slurp(other + "/photo_mean.png") == "my picture");
  CHECK_FALSE(exists(other + "/photo.json"));
  std::filesystem::copy_file(dir + "/data.json", other + "/copy.json");
  REQUIRE(cv::imwrite(other + "/copy.png", img));
  Run copy = run("export " + other + "/copy.png --model " + f.model + " --out " + other);
  CHECK(copy.code == 1);
  CHECK_THAT(copy.err, Catch::Contains("copy.json"));

  // A file another mode's record lists is vitlens' too: --layer's weights, then the maps' own.
  const std::string modes = make_dir(f.dir + "/modes");
  const std::string base = "export " + f.image + " --model " + f.model + " --out " + modes + " --size 0 --raw";
  CHECK(run(base + " --layer all").code == 0);
  const std::string layers_npy = slurp(modes + "/photo_layers_attn.npy");
  Run maps = run(base);
  INFO(maps.err);
  CHECK(maps.code == 0);
  // Each mode's weights are a file of its own: the maps' export leaves the layers' set whole.
  const nlohmann::json layers = nlohmann::json::parse(slurp(modes + "/photo_layers.json"));
  CHECK(layers["precision"] == "fp32");
  CHECK(layers["preprocess"] == "whole");
  for (const auto& file : layers["files"])
    CHECK(std::filesystem::exists(modes + "/" + std::filesystem::path(file.get<std::string>()).filename().string()));
  CHECK(slurp(modes + "/photo_layers_attn.npy") == layers_npy);
  CHECK(!layers_npy.empty());
  CHECK(std::filesystem::exists(modes + "/photo_attn.npy"));

  Run help = run("export --help");
  CHECK_THAT(help.out, Catch::Contains("--force") && Catch::Contains("vitlens did not write"));
}

TEST_CASE("cli: no mode's output replaces one of its inputs, whatever path names it", "[cli][trust]") {
  Fixture f;
  const std::string dir = make_dir(f.dir + "/inputs");
  cv::Mat img(16, 16, CV_8UC3, cv::Scalar(30, 60, 90));
  REQUIRE(cv::imwrite(dir + "/a.png", img));
  // Earlier outputs of vitlens (in inferno, so that an export over them in viridis would show),
  // given as inputs: --rollout's picture, --layer all's layer map and its layers montage, the last
  // through a hard link of another name.
  const std::string export_a = "export " + dir + "/a.png --model " + f.model + " --out " + dir + " --colormap inferno";
  REQUIRE(run(export_a + " --rollout").code == 0);
  REQUIRE(run(export_a + " --layer all").code == 0);
  const std::string linked = make_dir(f.dir + "/elsewhere") + "/montage.png";
  REQUIRE(::link((dir + "/a_layers_montage.png").c_str(), linked.c_str()) == 0);
  std::map<std::string, std::string> before;
  for (const char* name : {"a_rollout.png", "a_layer0_mean.png", "a_layers_montage.png"}) before[name] = slurp(dir + "/" + name);

  Run rollout = run("export " + dir + "/a.png " + dir + "/a_rollout.png --rollout --model " + f.model + " --out " + dir);
  INFO(rollout.err);
  CHECK(rollout.code == 0);
  CHECK(slurp(dir + "/a_rollout.png") == before["a_rollout.png"]);
  CHECK(exists(dir + "/a_2_rollout.png"));  // a's rollout took the next free stem
  // The second input's rollout is of the picture as it was.
  CHECK_THAT(nlohmann::json::parse(slurp(dir + "/a_rollout_rollout.json"))["image"].get<std::string>(),
             Catch::EndsWith("/a_rollout.png"));

  Run layers = run("export " + dir + "/a.png " + dir + "/a_layer0_mean.png " + linked + " --layer all --model " + f.model +
                   " --out " + dir);
  INFO(layers.err);
  CHECK(layers.code == 0);
  for (const char* name : {"a_layer0_mean.png", "a_layers_montage.png"}) CHECK(slurp(dir + "/" + name) == before[name]);
  CHECK(exists(dir + "/a_2_layers_montage.png"));

  // A mask painted over an earlier output and saved in its place (a name a.json lists) is an
  // input too: never replaced.
  REQUIRE(run(export_a).code == 0);
  REQUIRE(cv::imwrite(dir + "/a_mean.png", cv::Mat(16, 16, CV_8UC3, cv::Scalar(255, 255, 255))));
  const std::string mask_before = slurp(dir + "/a_mean.png");
  Run masked = run(export_a + " --mask-image " + dir + "/a_mean.png");
  INFO(masked.err);
  CHECK(masked.code == 0);
  CHECK(slurp(dir + "/a_mean.png") == mask_before);
  CHECK(exists(dir + "/a_2_mean.png"));
}

TEST_CASE("cli: each export's summary names exactly the files it wrote", "[cli][trust]") {
  Fixture f;
  // A number in the stem (written with a leading zero) is part of every name, not a range.
  const std::string numbered = f.dir + "/img007.png";
  std::filesystem::copy_file(f.image, numbered);
  std::vector<std::pair<std::string, std::string>> runs;  // (image, mode)
  for (const char* mode : {"", "--raw", "--rollout", "--layer all", "--layer 0-1 --raw", "--rollout --layer 1"})
    for (const std::string& image : {f.image, numbered}) runs.emplace_back(image, mode);
  for (const auto& [image, mode] : runs) {
    INFO("mode '" << mode << "', " << image);
    const std::string out = test::temp_dir("summary");
    Run r = run("export " + image + " --model " + f.model + " --out " + out + " --size 0 " + mode);
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    // "<image>: N files in <out> (<names>), T ms"
    const size_t open = r.out.find(out + " (");
    const size_t close = r.out.rfind("), ");
    REQUIRE(open != std::string::npos);
    REQUIRE(close != std::string::npos);
    const std::string list = r.out.substr(open + out.size() + 2, close - open - out.size() - 2);
    std::vector<std::string> named;
    for (size_t start = 0; start <= list.size();) {
      const size_t comma = std::min(list.find(", ", start), list.size());
      for (const std::string& name : expand_ranges(list.substr(start, comma - start))) named.push_back(name);
      start = comma + 2;
    }
    std::sort(named.begin(), named.end());
    CHECK(named == visible_files(out));
    CHECK_THAT(r.out, Catch::Contains(": " + std::to_string(named.size()) + " files in "));
  }
}

namespace {

// Every visible file of a folder with its bytes.
std::map<std::string, std::string> folder_bytes(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const std::string& name : visible_files(dir)) files[name] = slurp(dir + "/" + name);
  return files;
}

// The file names a record lists, without their folder.
std::vector<std::string> listed_files(const std::string& record) {
  std::vector<std::string> names;
  const nlohmann::json j = nlohmann::json::parse(slurp(record));
  for (const auto& file : j["files"])
    names.push_back(std::filesystem::path(file.get<std::string>()).filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("cli: an image's export never replaces another image's files that have its names", "[cli][trust]") {
  Fixture f;
  cv::Mat other(16, 16, CV_8UC3, cv::Scalar(200, 40, 10));
  // x_layer0.png's maps have the names of x.png's layer 0 in a --layer export, and its record the
  // name of that layer's record.
  const std::string dir = make_dir(f.dir + "/layers");
  std::filesystem::copy_file(f.image, f.dir + "/x.png");
  REQUIRE(cv::imwrite(f.dir + "/x_layer0.png", other));
  REQUIRE(run("export " + f.dir + "/x.png --layer all --model " + f.model + " --out " + dir).code == 0);
  // Refused in one line naming `name`, the folder as it was: nothing replaced, nothing added.
  const auto check_refused = [](const std::string& command, const std::string& folder, const std::string& name) {
    const auto before = folder_bytes(folder);
    const Run refused = run(command);
    CHECK(refused.code == 1);
    CHECK(count_lines(refused.err) == 1);
    CHECK_THAT(refused.err, Catch::Contains(name) && Catch::Contains("another image's export"));
    CHECK(folder_bytes(folder) == before);
    CHECK(test::hidden_entries(folder) == 0);
  };
  check_refused("export " + f.dir + "/x_layer0.png --model " + f.model + " --out " + dir, dir, dir + "/x_layer0");
  std::vector<std::string> set = listed_files(dir + "/x_layers.json");
  set.push_back("x_layers.json");
  std::sort(set.begin(), set.end());
  CHECK(set == visible_files(dir));

  // x.png's rollout has the record name of x_rollout.png's maps: neither that record nor the files
  // it lists are replaced or removed.
  const std::string rollout = make_dir(f.dir + "/rollout");
  REQUIRE(cv::imwrite(f.dir + "/x_rollout.png", other));
  REQUIRE(run("export " + f.dir + "/x_rollout.png --model " + f.model + " --out " + rollout).code == 0);
  const auto maps = folder_bytes(rollout);
  check_refused("export " + f.dir + "/x.png --rollout --model " + f.model + " --out " + rollout, rollout,
                rollout + "/x_rollout.json");
  // --force replaces files vitlens did not write, not another image's export.
  CHECK(run("export " + f.dir + "/x.png --rollout --force --model " + f.model + " --out " + rollout).code == 1);
  CHECK(folder_bytes(rollout) == maps);
  // Each image still exports again over its own set.
  Run again = run("export " + f.dir + "/x_rollout.png --raw --model " + f.model + " --out " + rollout);
  INFO(again.err);
  CHECK(again.code == 0);
  CHECK(exists(rollout + "/x_rollout_attn.npy"));
}

TEST_CASE("cli: a narrower --layer range removes the layers its previous export wrote and it does not", "[cli][trust]") {
  Fixture f;
  const std::string dir = make_dir(f.dir + "/narrow");
  const std::string export_photo = "export " + f.image + " --model " + f.model + " --out " + dir;
  REQUIRE(run(export_photo).code == 0);  // the maps of the same image: another set, left whole
  const auto maps = folder_bytes(dir);
  REQUIRE(run(export_photo + " --layer all").code == 0);
  REQUIRE(exists(dir + "/photo_layer0_head0.png"));
  Run narrower = run(export_photo + " --layer 1-1");
  INFO(narrower.err);
  REQUIRE(narrower.code == 0);
  std::vector<std::string> expected = listed_files(dir + "/photo_layers.json");
  expected.push_back("photo_layers.json");
  for (const auto& [name, bytes] : maps) {
    expected.push_back(name);
    CHECK(slurp(dir + "/" + name) == bytes);
  }
  std::sort(expected.begin(), expected.end());
  CHECK(visible_files(dir) == expected);
  CHECK_FALSE(exists(dir + "/photo_layer0_head0.png"));
  CHECK_FALSE(exists(dir + "/photo_layer0.json"));
  CHECK(exists(dir + "/photo_layer1_head0.png"));
}

TEST_CASE("cli: an export never removes one of its own inputs, even a file its previous export wrote", "[cli][trust]") {
  Fixture f;
  const std::string dir = make_dir(f.dir + "/inputs");
  REQUIRE(run("export " + f.image + " --model " + f.model + " --out " + dir).code == 0);  // 4 heads: photo_head3.png
  const std::string head3 = slurp(dir + "/photo_head3.png");
  // The same image again with a 2-head model, the old head 3 map as a second image: the new set
  // lacks photo_head3.png, but the run reads it, so it stays (unlisted).
  VitConfig two = test::small_config(16, true, 2);
  two.num_heads = 2;
  const std::string model2 = f.dir + "/two_heads.safetensors";
  save_model(model2, two, test::random_tensors(two, 5));
  const Run r = run("export " + f.image + " " + dir + "/photo_head3.png --model " + model2 + " --out " + dir);
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(slurp(dir + "/photo_head3.png") == head3);
  CHECK_FALSE(exists(dir + "/photo_head2.png"));  // listed by the replaced record only: removed
  CHECK(exists(dir + "/photo_head3_head1.png"));   // the second image's maps
  const std::vector<std::string> listed = listed_files(dir + "/photo.json");
  CHECK(std::find(listed.begin(), listed.end(), "photo_head3.png") == listed.end());
}

TEST_CASE("export sets: a file the replaced record lists is removed unless another set lists it or the run reads it", "[files][trust]") {
  const std::string dir = test::temp_dir("unlisted");
  const auto commit = [&](const std::vector<std::string>& files) {
    OutputSet set(dir);
    for (const std::string& name : files) set.add(name, "written by " + name);
    return set.commit("x.json", {{"image", "in/x.png"}});
  };
  commit({"x_a.txt", "x_b.txt", "x_c.txt", "x_d.txt"});
  // x_c.txt is an input of this process (named through a link elsewhere): the run reads it later.
  const std::string input = test::temp_dir("unlisted-input") + "/input.txt";
  REQUIRE(::link((dir + "/x_c.txt").c_str(), input.c_str()) == 0);
  OutputSet::keep_inputs({input});
  // x_d.txt is listed by another image's record too (as a version before that was refused left it).
  {
    OutputSet other(dir);
    other.add("y_e.txt", "e");
    other.commit("y.json", {{"image", "y.png"}});
  }
  nlohmann::json y = nlohmann::json::parse(slurp(dir + "/y.json"));
  y["files"].push_back(dir + "/x_d.txt");
  spit(dir + "/y.json", y.dump());

  commit({"x_a.txt"});
  CHECK(slurp(dir + "/x_a.txt") == "written by x_a.txt");
  CHECK_FALSE(exists(dir + "/x_b.txt"));  // listed by the replaced record only: removed
  CHECK(slurp(dir + "/x_c.txt") == "written by x_c.txt");
  CHECK(slurp(dir + "/x_d.txt") == "written by x_d.txt");
  CHECK(listed_files(dir + "/x.json") == std::vector<std::string>{"x_a.txt"});
  CHECK(test::hidden_entries(dir) == 0);
}

// [SECTION] Flags the viewer had, the output folder, formats

namespace {

// A 512 x 384 photo-like picture: smooth colours with a bright square, so maps have structure.
std::string write_photo(const std::string& dir) {
  cv::Mat img(384, 512, CV_8UC3);
  for (int y = 0; y < img.rows; ++y)
    for (int x = 0; x < img.cols; ++x)
      img.at<cv::Vec3b>(y, x) = cv::Vec3b(static_cast<uchar>(x / 2), static_cast<uchar>(y / 2), static_cast<uchar>((x + y) / 4));
  img(cv::Rect(300, 200, 80, 80)).setTo(cv::Scalar(250, 250, 250));
  const std::string path = dir + "/big_photo.png";
  REQUIRE(cv::imwrite(path, img));
  return path;
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(slurp(path)); }

}  // namespace

TEST_CASE("cli: export --help tells of the new flags", "[cli]") {
  Run eh = run("export --help");
  CHECK(eh.code == 0);
  for (const char* text : {"--query-processed", "--temperature", "--threshold", "--mask-image", "robust",
                           "before any resizing", "created"})
    CHECK_THAT(eh.out, Catch::Contains(text));
}

TEST_CASE("cli: --query is in the image's own pixels, --query-processed in the processed image's", "[cli]") {
  Fixture f;
  const std::string photo = write_photo(f.dir);  // 512x384 -> 224x168 at the bundled model's size
  const std::string base = "export " + photo + " --out " + f.dir + " ";
  Run r = run(base + "--query 500,380");
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto j = read_json(f.dir + "/big_photo.json");
  CHECK(j["query"]["source_pixel"] == nlohmann::json({500, 380}));
  // (500.5 * 224 / 512, 380.5 * 168 / 384) = (218.97, 166.47) -> patch (166 / 4, 218 / 4) = (41, 54)
  CHECK(j["query"]["patch"] == nlohmann::json({41, 54}));
  CHECK(j["mode"] == "query");

  Run processed = run(base + "--query-processed 500,380");
  CHECK(processed.code == 1);
  CHECK_THAT(processed.err, Catch::Contains("outside the 224x168 processed image"));
  CHECK(run(base + "--query-processed 218,166").code == 0);
  j = read_json(f.dir + "/big_photo.json");
  CHECK(j["query"]["patch"] == nlohmann::json({41, 54}));
  CHECK(j["query"]["processed_pixel"] == nlohmann::json({218, 166}));
  CHECK_FALSE(j["query"].contains("source_pixel"));

  Run outside = run(base + "--query 512,0");
  CHECK(outside.code == 1);
  CHECK_THAT(outside.err, Catch::Contains("outside the 512x384 image"));
  Run both = run(base + "--query 1,1 --query-processed 1,1");
  CHECK(both.code == 2);
  Run bad = run(base + "--query-processed 1");
  CHECK(bad.code == 2);
  CHECK_THAT(bad.err, Catch::Contains("--query-processed expects two integers"));
}

TEST_CASE("cli: --temperature and --threshold are applied and recorded", "[cli]") {
  Fixture f;
  const std::string base = "export " + f.image + " --model " + f.model + " --out " + f.dir + " --size 0 --cls ";
  REQUIRE(run(base).code == 0);
  auto plain = read_json(f.dir + "/photo.json");
  CHECK(plain["temperature"] == 1.0);
  CHECK(plain["threshold"].is_null());
  CHECK(plain["normalize"] == "robust");  // the new default
  CHECK(plain["score_scale"].get<double>() == Approx(1.0 / std::sqrt(12.0)).epsilon(1e-6));
  CHECK(plain["robust_percentile"] == 99.0);
  CHECK(plain["robust_max_saturated_mass"] == 0.1);
  REQUIRE(plain["colour_scale_top"].size() == 5);
  for (size_t h = 0; h < 4; ++h)  // the robust top: at most the maximum
    CHECK(plain["colour_scale_top"][h].get<double>() <= plain["heads"][h]["max"].get<double>());
  REQUIRE(run(base + "--normalize head").code == 0);
  const auto per_head = read_json(f.dir + "/photo.json");
  CHECK(per_head["normalize"] == "head");
  for (size_t h = 0; h < 4; ++h)  // the old scale: each head's maximum
    CHECK(per_head["colour_scale_top"][h].get<double>() == per_head["heads"][h]["max"].get<double>());

  Run hot = run(base + "--temperature 2.5");
  INFO(hot.err);
  REQUIRE(hot.code == 0);
  auto j = read_json(f.dir + "/photo.json");
  CHECK(j["temperature"].get<double>() == Approx(2.5).epsilon(1e-6));
  CHECK(j["score_scale"].get<double>() == Approx(1.0 / (std::sqrt(12.0) * 2.5)).epsilon(1e-6));
  // A higher temperature flattens every head's class-token row: its entropy grows.
  for (size_t h = 0; h < 4; ++h)
    CHECK(j["heads"][h]["entropy"].get<double>() > plain["heads"][h]["entropy"].get<double>());

  REQUIRE(run(base + "--threshold 0.6").code == 0);
  j = read_json(f.dir + "/photo.json");
  CHECK(j["threshold"]["mass"] == 0.6);
  REQUIRE(j["threshold"]["heads_then_mean"].size() == 5);
  for (const auto& t : j["threshold"]["heads_then_mean"]) {
    CHECK(t["kept_mass"].get<double>() >= 0.6);
    CHECK(t["total_patches"] == 20);  // the image's 5x4 patches: the 10 padding patches are not part of it
    CHECK(t["no_structure"] == false);
  }
  // The maps as drawn are the kept maps: their sums are what was kept.
  const double kept = j["threshold"]["heads_then_mean"][0]["kept_mass"].get<double>();
  CHECK(j["heads"][0]["sum"].get<double>() == Approx(kept * plain["heads"][0]["sum"].get<double>()).epsilon(1e-4));

  for (const char* bad : {"--temperature 0", "--temperature nan", "--temperature 100", "--threshold 0",
                          "--threshold 1.5", "--threshold abc", "--threshold nan"}) {
    Run r = run(base + bad);
    INFO(bad << " -> " << r.err);
    CHECK(r.code == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK_THAT(r.err, Catch::Contains(std::string(bad).substr(0, std::string(bad).find(' '))));
  }
}

TEST_CASE("cli: --threshold on a flat image reports no structure", "[cli]") {
  Fixture f;
  cv::Mat grey(224, 224, CV_8UC3, cv::Scalar(128, 128, 128));
  REQUIRE(cv::imwrite(f.dir + "/grey.png", grey));
  Run r = run("export " + f.dir + "/grey.png --cls --threshold 0.6 --out " + f.dir);
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto j = read_json(f.dir + "/grey.json");
  for (const auto& t : j["threshold"]["heads_then_mean"]) {
    CHECK(t["no_structure"] == true);
    CHECK(t["kept_patches"] == t["total_patches"]);
  }
}

TEST_CASE("cli: --mask-image forbids the painted keys", "[cli]") {
  Fixture f;  // photo.png is 22x18: a mask of 44x36 has its aspect ratio
  cv::Mat mask(36, 44, CV_8UC3, cv::Scalar(255, 255, 255));
  mask(cv::Rect(0, 0, 16, 36)).setTo(cv::Scalar(0, 0, 0));  // the left 8 source pixels: patch columns 0 and 1
  REQUIRE(cv::imwrite(f.dir + "/mask.png", mask));
  const std::string base = "export " + f.image + " --model " + f.model + " --out " + f.dir + " --size 0 --cls ";
  Run r = run(base + "--mask-image " + f.dir + "/mask.png");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto j = read_json(f.dir + "/photo.json");
  CHECK(j["mask"]["image"] == f.dir + "/mask.png");
  // columns 0 and 1 of the 4 non-padding rows (row 4 holds padded pixels: 18 = 4*4 + 2)
  CHECK(j["mask"]["painted_patches"] == 2 * 4);
  // Forbidden keys get no weight from any query, in any layer or head (raw weights, 1 + 6x5 tokens).
  REQUIRE(run(base + "--raw --mask-image " + f.dir + "/mask.png").code == 0);
  const std::string npy = slurp(f.dir + "/photo_attn.npy");
  const size_t header_len = static_cast<unsigned char>(npy[8]) | (static_cast<unsigned char>(npy[9]) << 8);
  REQUIRE(npy.size() == 10 + header_len + 2 * 4 * 31 * 31 * 4);
  const float* probs = reinterpret_cast<const float*>(npy.data() + 10 + header_len);
  int forbidden_nonzero = 0, allowed_nonzero = 0;
  for (int m = 0; m < 2 * 4; ++m)
    for (int i = 0; i < 31; ++i)
      for (int row = 0; row < 4; ++row)
        for (int col = 0; col < 6; ++col) {
          const float w = probs[(m * 31 + i) * 31 + 1 + row * 6 + col];
          if (col < 2) forbidden_nonzero += w != 0.0f;
          if (col >= 2 && col < 5) allowed_nonzero += w != 0.0f;
        }
  CHECK(forbidden_nonzero == 0);
  CHECK(allowed_nonzero == 2 * 4 * 31 * 4 * 3);

  Run missing = run(base + "--mask-image " + f.dir + "/nope.png");
  CHECK(missing.code == 1);  // a file that cannot be read, as any image
  CHECK(count_lines(missing.err) == 1);
  CHECK_THAT(missing.err, Catch::Contains("--mask-image") && Catch::Contains("nope.png"));
  cv::Mat square(30, 30, CV_8UC3, cv::Scalar(255, 255, 255));
  REQUIRE(cv::imwrite(f.dir + "/square.png", square));
  Run aspect = run(base + "--mask-image " + f.dir + "/square.png");
  CHECK(aspect.code == 1);
  CHECK(count_lines(aspect.err) == 1);
  CHECK_THAT(aspect.err, Catch::Contains("aspect ratio"));
}

TEST_CASE("cli: --out is created when missing, a file is still refused", "[cli]") {
  Fixture f;
  const std::string nested = f.dir + "/new/deeper/out";
  Run r = run("export " + f.image + " --model " + f.model + " --out " + nested);
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(exists(nested + "/photo_montage.png"));
  Run file_as_dir = run("export " + f.image + " --model " + f.model + " --out " + f.image);
  CHECK(file_as_dir.code == 1);
  CHECK_THAT(file_as_dir.err, Catch::Contains("not a folder"));
  Run under_file = run("export " + f.image + " --model " + f.model + " --out " + f.image + "/sub");
  CHECK(under_file.code == 1);
  CHECK(count_lines(under_file.err) == 1);
  CHECK_THAT(under_file.err, Catch::Contains("cannot create the output folder"));
  // A bad flag creates nothing.
  Run bad = run("export " + f.image + " --model " + f.model + " --out " + f.dir + "/never --alpha 3");
  CHECK(bad.code == 2);
  CHECK_FALSE(exists(f.dir + "/never"));
}

TEST_CASE("cli: a GIF is refused with the formats that work", "[cli][errors]") {
  Fixture f;
  // A real 1x1 GIF89a: header, logical screen, colour table, image block, trailer.
  const unsigned char gif[] = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0, 0x80, 0, 0, 0, 0, 0, 255, 255, 255,
                               ',', 0, 0, 0, 0, 1, 0, 1, 0, 0, 2, 2, 0x44, 1, 0, ';'};
  std::ofstream(f.dir + "/anim.gif", std::ios::binary).write(reinterpret_cast<const char*>(gif), sizeof gif);
  Run r = run("export " + f.dir + "/anim.gif --model " + f.model + " --out " + f.dir);
  CHECK(r.code == 1);
  CHECK(count_lines(r.err) == 1);
  CHECK_THAT(r.err, Catch::Contains("anim.gif") && Catch::Contains("GIF") && Catch::Contains("PNG, JPEG"));
  std::ofstream(f.dir + "/notes.txt") << "plain text";
  Run text = run("export " + f.dir + "/notes.txt --model " + f.model + " --out " + f.dir);
  CHECK(text.code == 1);
  CHECK_THAT(text.err, Catch::Contains("vitlens reads PNG, JPEG"));
}

TEST_CASE("cli: bundled models by name: models, export, info, a bad name", "[cli][names]") {
  Run m = run("models");
  INFO(m.err);
  CHECK(m.code == 0);
  CHECK(count_lines(m.out) == 5);  // the folder, then one line a model
  for (const char* name : {"\n  designed ", "\n  random ", "\n  fashion-mnist ", "\n  mae-photos "})
    CHECK_THAT(m.out, Catch::Contains(name));
  const std::string dir = test::temp_dir("cli-names");
  Run e = run("export " + default_image_path() + " --model fashion-mnist --out " + dir + " --quiet");
  INFO(e.err);
  CHECK(e.code == 0);
  CHECK(exists(dir + "/vitlens-demo_montage.png"));
  Run i = run("info --model mae-photos");
  CHECK(i.code == 0);
  CHECK_THAT(i.out, Catch::Contains("vitlens-mae-photos.safetensors"));
  Run bad = run("export " + default_image_path() + " --model no-such-model --out " + dir);
  CHECK(bad.code == 1);
  CHECK(count_lines(bad.err) == 1);
  CHECK_THAT(bad.err, Catch::Contains("no such file, and no bundled model has this name: designed, fashion-mnist"));
  // An assets folder without models: the error alone, no heading over an empty list.
  Run none = test::run_vitlens_shell(dir, "models", "VITLENS_ASSETS=" + dir);
  CHECK(none.code == 1);
  CHECK(none.out.empty());
  CHECK(count_lines(none.err) == 1);
  CHECK_THAT(none.err, Catch::Contains("no bundled models in " + dir));
}

TEST_CASE("cli: an image whose name is not UTF-8 exports again into the same folder", "[cli][trust]") {
  Fixture f;
  const std::string dir = make_dir(f.dir + "/latin1");
  cv::Mat img(16, 16, CV_8UC3, cv::Scalar(30, 60, 90));
  const std::string latin1 = f.dir + "/caf\xe9.png";  // "café" in Latin-1: not UTF-8
  REQUIRE(cv::imwrite(latin1, img));
  const std::string export_latin1 = "export '" + latin1 + "' --model " + f.model + " --out " + dir;
  Run first = run(export_latin1 + " --raw");
  INFO(first.err);
  REQUIRE(first.code == 0);
  const std::vector<std::string> with_raw = visible_files(dir);
  // The record names its files exactly: the byte that is not UTF-8 as \xNN, not U+FFFD.
  const nlohmann::json record = nlohmann::json::parse(slurp(dir + "/caf\xe9.json"));
  CHECK(record[kRecordKey] == "caf\\xe9.json");
  for (const auto& file : record["files"]) CHECK_THAT(file.get<std::string>(), Catch::Contains("/caf\\xe9_"));
  // Again, without --raw: it replaces its own files and removes the .npy it no longer writes.
  Run again = run(export_latin1);
  INFO(again.err);
  CHECK(again.code == 0);
  const std::vector<std::string> now = visible_files(dir);
  CHECK(test::hidden_entries(dir) == 0);
  CHECK(now.size() < with_raw.size());
  for (const std::string& name : now) {
    CHECK(name.rfind("caf\xe9", 0) == 0);
    CHECK(name.find(".npy") == std::string::npos);
  }
  const nlohmann::json replaced = nlohmann::json::parse(slurp(dir + "/caf\xe9.json"));
  CHECK(replaced["files"].size() + 1 == now.size());  // one set: its files and its record

  // A user's file literally named as the record writes a Latin-1 name ("caf\xe9_head0.png", with
  // a backslash) is not proven by that record: an export that would write that name refuses.
  spit(dir + "/caf\\xe9_head0.png", "my picture");
  const std::string literal = f.dir + "/caf\\xe9.png";
  REQUIRE(cv::imwrite(literal, img));
  Run refused = run("export '" + literal + "' --model " + f.model + " --out " + dir);
  CHECK(refused.code == 1);
  CHECK_THAT(refused.err, Catch::Contains("caf\\xe9_head0.png: exists and no record of vitlens here lists it"));
  CHECK(slurp(dir + "/caf\\xe9_head0.png") == "my picture");
  CHECK(visible_files(dir).size() == now.size() + 1);  // nothing of that set was written
  // Exported where nothing is in the way, its names are written with the backslash escaped.
  const std::string own = make_dir(f.dir + "/backslash");
  Run plain = run("export '" + literal + "' --model " + f.model + " --out " + own);
  INFO(plain.err);
  REQUIRE(plain.code == 0);
  CHECK(nlohmann::json::parse(slurp(own + "/caf\\xe9.json"))[kRecordKey] == "caf\\x5cxe9.json");
  CHECK(run("export '" + literal + "' --model " + f.model + " --out " + own).code == 0);

  // A record written before names were escaped holds a name with a backslash as plain text: still
  // vitlens' own, so its files are replaced without --force.
  nlohmann::json old = nlohmann::json::parse(slurp(own + "/caf\\xe9.json"));
  old[kRecordKey] = "caf\\xe9.json";
  for (auto& file : old["files"]) {
    std::string path = file.get<std::string>();
    for (size_t at; (at = path.find("\\x5c")) != std::string::npos;) path.replace(at, 4, "\\");
    file = path;
  }
  spit(own + "/caf\\xe9.json", old.dump(2));
  Run after_old = run("export '" + literal + "' --model " + f.model + " --out " + own);
  INFO(after_old.err);
  CHECK(after_old.code == 0);
  CHECK(nlohmann::json::parse(slurp(own + "/caf\\xe9.json"))[kRecordKey] == "caf\\x5cxe9.json");
}
