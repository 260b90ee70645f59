// Hostile model files and recipes as a user meets them: vitlens run as a child (process_support.hpp)
// on a file the test makes, with its exit code, its one line on stderr and its own peak memory,
// each bounded. A name of megabytes, a header of tens of megabytes, an allocation that fails under
// an address-space limit and a recipe of billions of parameters each cost a few MB and end in one
// line: never gigabytes, an abort or a library's text.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <functional>

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>

#include "process_support.hpp"
#include "test_support.hpp"
#include "core/io/files.hpp"
#include "core/base/utf8.hpp"
#include "core/io/json_text.hpp"
#include "core/render/export_layers.hpp"
#include "models/json_file.hpp"
#include "models/model_io.hpp"
#include "models/safetensors.hpp"

namespace {

using namespace vitlens;
using Catch::Contains;
using nlohmann::json;
using test::Child;
using test::run_vitlens;

std::string le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}

// What the user sees on stderr: one line, no raw escape byte.
void check_one_line(const Child& c) {
  INFO("stderr: " << c.err);
  CHECK(c.signal == 0);
  REQUIRE(!c.err.empty());
  CHECK(c.err.find('\n') == c.err.size() - 1);
  CHECK(c.err.rfind("vitlens: ", 0) == 0);
  CHECK(c.err.find('\x1b') == std::string::npos);
}

// The small test model (two blocks) with its config JSON edited, written as F32 safetensors
// without save_model's checks, so the config may hold what no vitlens writer would write.
std::string write_edited_model(const std::string& dir, const std::function<void(json&)>& edit) {
  const VitConfig c = test::small_config(16, true, 2);
  json config = config_to_json(c);
  edit(config);
  SafetensorsFile file;
  file.tensors = test::random_tensors(c, 5);
  file.metadata["config"] = config.dump();
  const std::string path = dir + "/edited.safetensors";
  write_safetensors(path, file);
  return path;
}

// A header of `header_text` (padded with spaces) and `data_bytes` of zero data, the data made by
// extending the file (sparse: no disk, no memory in this process).
std::string write_header_and_zeros(const std::string& path, std::string header_text, uint64_t data_bytes) {
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const std::string start = le64(header_text.size()) + header_text;
  write_file_atomic(path, start);
  REQUIRE(::truncate(path.c_str(), static_cast<off_t>(start.size() + data_bytes)) == 0);
  return path;
}

// A valid vitlens model file whose every tensor is `dtype` zeros (zeros are fine weights).
std::string write_zero_model(const std::string& path, const VitConfig& config, const std::string& dtype) {
  const uint64_t elem = dtype == "F16" ? 2 : 4;
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, shape] : expected_tensor_shapes(config)) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {offset, offset + n * elem}}};
    offset += n * elem;
  }
  header["__metadata__"] = {{"config", config_to_json(config).dump()}, {"format", "pt"}};
  return write_header_and_zeros(path, header.dump(), offset);
}

std::string write_photo(const std::string& path, int side) {
  cv::Mat img(side, side, CV_8UC3);
  cv::randu(img, 0, 255);
  REQUIRE(cv::imwrite(path, img));
  return path;
}

// An ImageFolder tree at `data`: classes a and b, two 32 px photos each.
void write_two_classes(const std::string& data) {
  REQUIRE(::mkdir(data.c_str(), 0755) == 0);
  for (const char* cls : {"a", "b"}) {
    REQUIRE(::mkdir((data + "/" + cls).c_str(), 0755) == 0);
    for (int i = 0; i < 2; ++i) write_photo(data + "/" + cls + "/" + std::to_string(i) + ".png", 32);
  }
}

}  // namespace

TEST_CASE("a model's name and description of megabytes cost what short ones cost, and print escaped",
          "[hostile-model][text]") {
  const std::string dir = test::temp_dir("name-bomb");
  const std::string escapes = "\x1b[31mred\x1b]0;retitled\x07\r";
  const std::string model = write_edited_model(dir, [&](json& j) {
    j["name"] = escapes + std::string(1 << 20, 'n');  // 1 MB: 22 s, 2.6 GB and a 409 MB montage before
    j["description"] = escapes + std::string(1 << 20, 'd');
    j["head_descriptions"] = {{escapes + std::string(1 << 20, 'h'), "b", "c", "d"}, {"e", "f", "g", "h"}};
  });
  const std::string image = write_photo(dir + "/photo.png", 40);

  const Child info = run_vitlens({"info", "--model", model});
  INFO("stderr: " << info.err);
  CHECK(info.code == 0);
  CHECK(info.out.find('\x1b') == std::string::npos);  // shown as \x1b, never sent
  CHECK(info.out.find('\x07') == std::string::npos);
  CHECK(info.out.find('\r') == std::string::npos);
  CHECK_THAT(info.out, Contains("\\x1b[31mred"));
  CHECK(info.out.size() < 16 * 1024);
  CHECK(info.max_rss_kb < 150 * 1024);

  const Child exported = run_vitlens({"export", image, "--model", model, "--out", dir, "-q"});
  INFO("stderr: " << exported.err);
  CHECK(exported.code == 0);
  const cv::Mat montage = cv::imread(dir + "/photo_montage.png");
  REQUIRE(!montage.empty());
  CHECK(montage.rows < 2000);
  CHECK(montage.cols < 2000);
  CHECK(exported.max_rss_kb < 300 * 1024);
  WARN("1 MB name: info peak " << info.max_rss_kb / 1024 << " MiB, export peak " << exported.max_rss_kb / 1024
                               << " MiB, montage " << montage.cols << "x" << montage.rows);

  // An error quoting the name: one line, escaped, not a megabyte.
  const Child error = run_vitlens({"export", image, "--model", model, "--out", dir, "--layer", "7"});
  CHECK(error.code == 2);  // a flag the model cannot take
  check_one_line(error);
  CHECK_THAT(error.err, Contains("\\x1b"));
  CHECK(error.err.size() < 4096);

  // --heads that contradicts the file is one line too (it was silently ignored).
  const Child heads = run_vitlens({"info", "--model", model, "--heads", "2"});
  CHECK(heads.code == 1);
  check_one_line(heads);
  CHECK_THAT(heads.err, Contains("--heads 2") && Contains("4 heads"));
}

TEST_CASE("a safetensors header of tens of MB costs about its own size and ends in one line", "[hostile-model][memory]") {
  const std::string dir = test::temp_dir("header-bomb");
  struct Case {
    const char* what;
    std::string header;
    uint64_t data;
  };
  std::vector<Case> cases;
  {
    // 32 MB of small __metadata__ entries: a DOM of each costs about 20 times its text.
    std::string text = "{\"__metadata__\":{";
    for (int i = 0; text.size() < (32u << 20); ++i) text += (i ? ",\"" : "\"") + std::to_string(i) + "\":\"\"";
    cases.push_back({"metadata_keys", text + "}}", 0});
  }
  {
    // 32 MB of tiny tensor entries, each of one F32 value: a valid container, until the count.
    std::string text = "{";
    uint64_t i = 0;
    for (; text.size() < (32u << 20); ++i)
      text += (i ? ",\"" : "\"") + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" +
              std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
    cases.push_back({"tensors", text + "}", 4 * i});
  }
  {
    // One 32 MB metadata string: a JSON reader holds two growing copies of the token it reads.
    cases.push_back({"metadata_string", "{\"__metadata__\":{\"notes\":\"" + std::string(32u << 20, 'x') + "\"}}", 0});
  }
  {
    // 32 MB of 256 KB metadata strings: allowed, and each is kept once.
    std::string text = "{\"__metadata__\":{";
    for (int i = 0; i < 128; ++i) text += (i ? ",\"" : "\"") + std::to_string(i) + "\":\"" + std::string(256 << 10, 'x') + "\"";
    cases.push_back({"metadata_strings", text + "}}", 0});
  }
  for (const Case& c : cases) {
    INFO(c.what);
    const std::string path = write_header_and_zeros(dir + "/" + c.what + ".safetensors", c.header, c.data);
    // Under a 2 GB address-space limit too: the header must never get near it (SIGABRT before).
    const Child run = run_vitlens({"info", "--model", path}, 2048);
    CHECK(run.code == 1);
    check_one_line(run);
    const double header_mb = static_cast<double>(c.header.size()) / (1 << 20);
    WARN(c.what << ": " << header_mb << " MB header, peak " << run.max_rss_kb / 1024 << " MiB: " << run.err);
    // The header is read (1x) and parsed once more at most (a metadata string): 3x plus the
    // program is generous; a DOM was 10 to 20 times the header.
    CHECK(run.max_rss_kb / 1024.0 < 3.0 * header_mb + 60.0 + test::kSanitizerSlackMb);
  }
}

TEST_CASE("an allocation that fails is one line and exit code 1, never an abort", "[hostile-model][oom]") {
  if (!test::kAddressLimitsWork) {
    WARN("skipped: a sanitizer's allocator cannot run under an address-space limit, which this test needs");
    return;
  }
  const std::string dir = test::temp_dir("oom");
  // A ViT of width 1024 and 12 blocks (151 M parameters) as F16 zeros: a 288 MB file (sparse
  // here). Loading holds its 576 MB of floats and the 576 MB model: the file-size check predicts
  // 576 MB (2x the file), loading takes 1152 MB. vitlens itself maps about 190 MB before it
  // loads a model.
  VitConfig c = test::small_config(16, true, 12);
  c.embed_dim = 1024;
  c.num_heads = 8;
  c.mlp_ratio = 4.0;
  const std::string half = write_zero_model(dir + "/half.safetensors", c, "F16");
  // The limit lies half way between what the check predicts and what loading takes.
  const Child oom = run_vitlens({"info", "--model", half}, 1200);
  INFO("stderr: " << oom.err);
  CHECK(oom.code == 1);
  check_one_line(oom);
  CHECK_THAT(oom.err, Contains("out of memory"));

  // The same model in F32 (a 576 MB file) under a limit below 2x its file plus what vitlens maps
  // first: refused up front, with the numbers.
  const std::string full = write_zero_model(dir + "/full.safetensors", c, "F32");
  const Child refused = run_vitlens({"info", "--model", full}, 1200);
  INFO("stderr: " << refused.err);
  CHECK(refused.code == 1);
  check_one_line(refused);
  CHECK_THAT(refused.err, Contains("GiB of memory is available"));
  CHECK(refused.max_rss_kb < 100 * 1024);
}

TEST_CASE("a recipe of billions of parameters is refused before training, with the memory it needs",
          "[hostile-model][train]") {
  const std::string dir = test::temp_dir("huge-recipe");
  write_two_classes(dir + "/data");
  // 64 blocks of width 1024 with a 16x MLP: 2.4 billion parameters, 38 GB with Adam.
  const Child run = run_vitlens({"train", "--data", dir + "/data", "--out", dir + "/run", "--depth", "64", "--embed-dim",
                                 "1024", "--mlp-ratio", "16", "--batch", "2", "--val-split", "0", "--epochs", "1", "-q"},
                                8192);
  INFO("stderr: " << run.err);
  CHECK(run.code == 1);
  check_one_line(run);
  CHECK_THAT(run.err, Contains("parameters) needs about") && Contains("GiB"));
  CHECK(run.max_rss_kb < 200 * 1024);
}

TEST_CASE("JSON from outside nests at most 64 levels: deeper is refused before anything recurses over it",
          "[hostile-model][json]") {
  const auto nested = [](size_t levels) { return std::string(levels, '[') + std::string(levels, ']'); };
  CHECK(!parse_json_or_discarded(nested(kMaxJsonDepth)).is_discarded());
  CHECK(parse_json_or_discarded(nested(kMaxJsonDepth + 1)).is_discarded());
  // 64 objects, the innermost holding a number: 64 levels.
  std::string objects;
  for (int i = 0; i < kMaxJsonDepth; ++i) objects += "{\"a\": ";
  objects += "1" + std::string(kMaxJsonDepth, '}');
  CHECK(!parse_json_or_discarded(objects).is_discarded());
  CHECK(parse_json_or_discarded("{\"b\": " + objects + "}").is_discarded());
  CHECK(parse_json_or_discarded(nested(1000000)).is_discarded());
  CHECK(parse_json_or_discarded("{\"a\": [1, 2").is_discarded());
  CHECK(parse_json_or_discarded("{\"a\": [1, 2]}") == json{{"a", {1, 2}}});
  CHECK(parse_json_text(nested(kMaxJsonDepth), "x").dump() == nested(kMaxJsonDepth));
  CHECK_THROWS_WITH(parse_json_text(nested(kMaxJsonDepth + 1), "x"), "x is nested deeper than 64 levels");
  CHECK_THROWS_WITH(parse_json_text(nested(1000000), "x"), "x is nested deeper than 64 levels");
}

TEST_CASE("a checkpoint whose record, recipe or options nest a million levels is one line, its files untouched",
          "[hostile-model][train]") {
  const std::string dir = test::temp_dir("deep-record");
  write_two_classes(dir + "/data");
  const Child trained = run_vitlens({"train", "--data", dir + "/data", "--out", dir + "/run", "--depth", "1",
                                     "--embed-dim", "8", "--heads", "2", "--img-size", "16", "--batch", "2",
                                     "--val-split", "0", "--epochs", "2", "--stop-after", "1", "-q"});
  INFO("stderr: " << trained.err);
  REQUIRE(trained.code == 0);
  const std::string model = dir + "/run/last.safetensors", state = dir + "/run/last.state.safetensors";
  const std::string model_bytes = test::slurp(model), state_bytes = test::slurp(state);
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  // Each case: the file, the metadata key, and its new text made from the old one. Before the
  // limit, resuming the first one trained a step and then overflowed the stack writing it back.
  struct Case {
    std::string path, key;
    std::function<std::string(const std::string&)> edit;
  };
  const std::vector<Case> cases = {
      {model, "training", [&](const std::string& old) { return "{\"notes\": " + deep + ", " + old.substr(1); }},
      {state, "recipe", [&](const std::string&) { return deep; }},
      {state, "num_classes", [&](const std::string&) { return deep; }},
  };
  for (const Case& c : cases) {
    INFO("edited: " << c.key);
    SafetensorsFile file = read_safetensors(c.path);
    REQUIRE(file.metadata.count(c.key) == 1);
    if (c.key == "training") REQUIRE(file.metadata.at(c.key).rfind('{', 0) == 0);
    file.metadata[c.key] = c.edit(file.metadata.at(c.key));
    write_safetensors(c.path, file);
    const std::string edited = test::slurp(c.path);
    const Child resumed = run_vitlens({"train", "--data", dir + "/data", "--resume", model, "-q"});
    INFO("stderr: " << resumed.err);
    CHECK(resumed.code == 1);
    check_one_line(resumed);
    CHECK_THAT(resumed.err, Contains("nested deeper than 64 levels"));
    // Nothing written: the edited file as it was, the other one as training left it.
    CHECK(test::slurp(c.path) == edited);
    CHECK(test::slurp(c.path == model ? state : model) == (c.path == model ? state_bytes : model_bytes));
    if (c.key == "training") {  // the record is informational: the model still opens
      const Child info = run_vitlens({"info", "--model", model});
      INFO("info stderr: " << info.err);
      CHECK(info.code == 0);
      CHECK(info.signal == 0);
    }
    test::spit(model, model_bytes);
    test::spit(state, state_bytes);
  }
  // Put back, the run resumes.
  const Child resumed = run_vitlens({"train", "--data", dir + "/data", "--resume", model, "-q"});
  INFO("stderr: " << resumed.err);
  CHECK(resumed.code == 0);
}

TEST_CASE("a gradient dump writes two new files together and never replaces one that exists", "[hostile-model][train]") {
  const std::string dir = test::temp_dir("grad-dump");
  write_two_classes(dir + "/data");
  const auto dump = [&](const std::string& file) {
    return run_vitlens({"train", "--data", dir + "/data", "--depth", "1", "--embed-dim", "8", "--heads", "2",
                        "--img-size", "16", "--batch", "2", "--val-split", "0", "--epochs", "1", "-q", "--grad-dump",
                        file});
  };
  // A fresh name: the gradients and the weights, both.
  const Child fresh = dump(dir + "/g.safetensors");
  INFO("stderr: " << fresh.err);
  REQUIRE(fresh.code == 0);
  CHECK(read_safetensors(dir + "/g.safetensors").tensors.count("head.weight") == 1);
  CHECK(read_safetensors(dir + "/g.weights.safetensors").metadata.count("config") == 1);
  const std::string grads = test::slurp(dir + "/g.safetensors");
  // Names taken (by that dump, a user's file, a folder, a link to a file elsewhere): one line,
  // exit 1, every file as it was, nothing new in the folder.
  test::spit(dir + "/notes.txt", "precious");
  test::spit(dir + "/mine.weights.safetensors", "also precious");
  REQUIRE(::mkdir((dir + "/folder").c_str(), 0755) == 0);
  REQUIRE(::symlink((dir + "/notes.txt").c_str(), (dir + "/link").c_str()) == 0);
  const std::vector<std::string> before = test::entries(dir);
  for (const std::string& taken : {dir + "/g.safetensors", dir + "/notes.txt", dir + "/mine", dir + "/folder",
                                   dir + "/link"}) {
    const Child refused = dump(taken);
    INFO("--grad-dump " << taken << ": " << refused.err);
    CHECK(refused.code == 1);
    check_one_line(refused);
    CHECK_THAT(refused.err, Contains("already exists"));
    CHECK(test::entries(dir) == before);
  }
  CHECK(test::slurp(dir + "/g.safetensors") == grads);
  CHECK(test::slurp(dir + "/notes.txt") == "precious");
  CHECK(test::slurp(dir + "/mine.weights.safetensors") == "also precious");
  // A folder that does not exist: one line, nothing written.
  const Child missing = dump(dir + "/no/such/folder/g.safetensors");
  INFO("stderr: " << missing.err);
  CHECK(missing.code == 1);
  check_one_line(missing);
  CHECK(test::entries(dir) == before);
}

TEST_CASE("text a checkpoint records is UTF-8: settings refused up front, class folder names escaped",
          "[hostile-model][train][utf8]") {
  CHECK(is_valid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  for (const char* bad : {"caf\xe9", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\x80", "\xff"}) {
    INFO("bytes " << utf8_escaped(bad));
    CHECK(!is_valid_utf8(bad));
  }
  CHECK(utf8_escaped("caf\xe9 \xc3\xa9") == "caf\\xe9 \xc3\xa9");
  CHECK(utf8_escaped("\xe2\x82") == "\\xe2\\x82");

  const std::string dir = test::temp_dir("utf8-run");
  write_two_classes(dir + "/data");
  const auto train = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"train", "--depth", "1", "--embed-dim", "8", "--heads", "2", "--img-size", "16",
                                     "--batch", "2", "--val-split", "0", "--epochs", "2", "-q"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_vitlens(args);
  };
  // Settings the record holds: refused before any data is read, nothing made.
  const auto refused_with = [&](const std::vector<std::string>& extra, const std::string& flag) {
    const Child refused = train(extra);
    INFO("stderr: " << refused.err);
    CHECK(refused.code == 2);
    check_one_line(refused);
    CHECK_THAT(refused.err, Contains(flag + " is not valid UTF-8"));
    struct stat st {};
    CHECK(::lstat((dir + "/r1").c_str(), &st) != 0);
  };
  refused_with({"--data", dir + "/data", "--out", dir + "/r1", "--name", "\xff\xfe"}, "--name");
  refused_with({"--data", dir + "/data", "--out", dir + "/r1", "--description", "caf\xe9"}, "--description");
  REQUIRE(::rename((dir + "/data").c_str(), (dir + "/d\xe9").c_str()) == 0);
  refused_with({"--data", dir + "/d\xe9", "--out", dir + "/r1"}, "--data");
  refused_with({"--data", "photos:" + dir + "/d\xe9", "--out", dir + "/r1"}, "--data");
  // A class folder of another encoding is a label: trained, recorded escaped, resumed.
  REQUIRE(::rename((dir + "/d\xe9").c_str(), (dir + "/data").c_str()) == 0);
  REQUIRE(::rename((dir + "/data/a").c_str(), (dir + "/data/caf\xe9").c_str()) == 0);
  const Child trained = train({"--data", dir + "/data", "--out", dir + "/r2", "--stop-after", "1"});
  INFO("stderr: " << trained.err);
  REQUIRE(trained.code == 0);
  const json record = json::parse(read_safetensors(dir + "/r2/last.safetensors").metadata.at("training"));
  CHECK(record.at("class_names") == json{"b", "caf\\xe9"});
  const Child resumed = run_vitlens({"train", "--data", dir + "/data", "--resume", dir + "/r2/last.safetensors", "-q"});
  INFO("stderr: " << resumed.err);
  CHECK(resumed.code == 0);
}

TEST_CASE("every layer of a model at a large size: the layers montage stays an overview of bounded size",
          "[hostile-model][export][memory]") {
  CHECK(layers_montage_scale(10, 1e6) == 1.0);
  CHECK(layers_montage_scale(100, 1e6) == Approx(std::sqrt(kMaxLayersMontagePixels / 1e8)));
  const std::string dir = test::temp_dir("layers-montage");
  // 3 blocks of 12 heads, patches of 64 px: at --size 1024 each tile is over a megapixel, 39 of them
  // (12 heads and the mean a layer) about 55 Mpx at full size.
  VitConfig c = test::small_config(64, true, 3);
  c.patch_size = 64;
  c.embed_dim = 12;
  c.num_heads = 12;
  SafetensorsFile file;
  file.tensors = test::random_tensors(c, 5);
  file.metadata["config"] = config_to_json(c).dump();
  write_safetensors(dir + "/m.safetensors", file);
  const std::string photo = write_photo(dir + "/photo.png", 1024);
  const Child run = run_vitlens({"export", "--model", dir + "/m.safetensors", photo, "--size", "1024", "--layer", "all",
                                 "-q", "--out", dir + "/out"});
  INFO("stderr: " << run.err);
  REQUIRE(run.code == 0);
  const cv::Mat head = cv::imread(dir + "/out/photo_layer0_head0.png");
  const cv::Mat montage = cv::imread(dir + "/out/photo_layers_montage.png");
  REQUIRE(!head.empty());
  REQUIRE(!montage.empty());
  CHECK(head.cols >= 1024);  // each layer's own files at full size
  INFO("head " << head.cols << "x" << head.rows << ", layers montage " << montage.cols << "x" << montage.rows);
  CHECK(static_cast<double>(head.total()) * 39 > 1.5 * kMaxLayersMontagePixels);
  CHECK(static_cast<double>(montage.total()) < 1.25 * kMaxLayersMontagePixels);  // the tiles, labels and legend
}

TEST_CASE("a model config whose transform resizes to billions of pixels is one line, quickly, in a few MB",
          "[hostile-model][preprocess][memory]") {
  const std::string foreign = std::string(VITLENS_TEST_FIXTURES) + "/foreign/";
  const std::string dir = test::temp_dir("transform-bomb");
  const std::string photo = write_photo(dir + "/photo.png", 512);
  // A timm checkpoint whose crop_pct asks for a resize to 2^31 (an int overflow), 3.2 million or
  // 64000 px a side (12 GB at 0.0005): refused as the config is read.
  const std::string timm = dir + "/timm";
  REQUIRE(::mkdir(timm.c_str(), 0755) == 0);
  write_file_atomic(timm + "/model.safetensors", read_whole_file(foreign + "timm_vit/model.safetensors", "fixture", 1 << 20));
  json config = json::parse(read_whole_file(foreign + "timm_vit/config.json", "fixture", 1 << 20));
  for (double pct : {1e-9, 1e-5, 5e-4}) {
    INFO("crop_pct " << pct);
    config["pretrained_cfg"]["crop_pct"] = pct;
    write_file_atomic(timm + "/config.json", config.dump());
    const Child run = run_vitlens({"export", photo, "-m", timm + "/model.safetensors", "--preprocess", "model", "--out",
                                   dir + "/out", "-q"},
                                  2048);
    CHECK(run.code == 1);
    check_one_line(run);
    CHECK_THAT(run.err, Contains("config.json pretrained_cfg: 'crop_pct' is") && Contains("not in [0.5, 1]"));
    CHECK(run.max_rss_kb < 200 * 1024);
  }
  // A Hugging Face processor that resizes to 16384x16384: refused with the image, before the resize.
  const std::string hf = dir + "/hf";
  REQUIRE(::mkdir(hf.c_str(), 0755) == 0);
  for (const char* file : {"model.safetensors", "config.json"})
    write_file_atomic(hf + "/" + file, read_whole_file(foreign + "hf_vit/" + file, "fixture", 1 << 20));
  write_file_atomic(hf + "/preprocessor_config.json",
                    R"({"image_processor_type": "ViTImageProcessor", "size": {"height": 16384, "width": 16384}})");
  const Child run = run_vitlens({"export", photo, "-m", hf + "/model.safetensors", "--preprocess", "model", "--out",
                                 dir + "/out", "-q"},
                                2048);
  CHECK(run.code == 1);
  check_one_line(run);
  CHECK_THAT(run.err, Contains("preprocessor_config.json) resizes it to 16384x16384 (268 megapixels)"));
  CHECK(run.max_rss_kb < 200 * 1024);
}
