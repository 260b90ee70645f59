// The viewer's logic without a window (app/viewer: controller, worker, script, settings, file
// lists, statistics). References are computed independently: the full (N, N) weights from a
// keep_probs forward pass, closed forms for uniform attention, and core's own export path for
// what the viewer draws and writes.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <fstream>
#include <thread>

#include <sys/stat.h>

#include <opencv2/imgcodecs.hpp>

#include "control/attention_stats.hpp"
#include "control/controller.hpp"
#include "control/file_list.hpp"
#include "control/script.hpp"
#include "control/settings.hpp"
#include "training/train_session.hpp"
#include "process_support.hpp"
#include "test_support.hpp"
#include "core/base/error.hpp"
#include "core/cpu/bf16.hpp"
#include "core/io/preprocess.hpp"
#include "core/render/export.hpp"
#include "core/render/export_layers.hpp"
#include "core/io/files.hpp"
#include "core/io/image.hpp"
#include "models/model_transform.hpp"

using namespace vitlens;
using namespace vitlens::viewer;
namespace fs = std::filesystem;

namespace {

MatRM grid_of(std::initializer_list<float> values, int rows, int cols) {
  MatRM m(rows, cols);
  int i = 0;
  for (float v : values) m.data()[i++] = v;
  return m;
}

// A small RGB test picture: gradients and a block, so heads have something to look at.
cv::Mat test_picture(int w, int h) {
  cv::Mat rgb(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      rgb.at<cv::Vec3b>(y, x) = cv::Vec3b(static_cast<uchar>(x * 255 / w), static_cast<uchar>(y * 255 / h),
                                          static_cast<uchar>((x / 8 + y / 8) % 2 ? 220 : 30));
  return rgb;
}

// Runs the app's per-frame steps (without drawing) until it is idle; false on timeout.
bool run_until_idle(App& app, double seconds = 60.0) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    poll_worker(app);
    step_script(app);
    process_requests(app);
    schedule_compute(app);
    update_derived(app);
    if (is_idle(app) && !app.script.active()) return true;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

struct Fixture {
  std::string dir = test::temp_dir("viewer");
  std::string model_path = dir + "/model.safetensors";
  std::string image_path = dir + "/picture.png";
  std::string wide_path = dir + "/wide.png";
  Fixture() {
    save_model(model_path, test::small_config(32, true, 2), test::random_tensors(test::small_config(32, true, 2), 11));
    write_png_atomic(image_path, test_picture(32, 32));
    write_png_atomic(wide_path, test_picture(50, 30));
  }
  ~Fixture() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

bool same_bytes(const cv::Mat& a, const cv::Mat& b) {
  return a.size() == b.size() && a.type() == b.type() && cv::norm(a, b, cv::NORM_INF) == 0.0;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

// [SECTION] Threshold

TEST_CASE("viewer threshold keeps the fewest largest patches holding the mass (DINO's rule)", "[viewer]") {
  // sorted ascending 0.1 0.1 0.3 0.5 -> cumulative 0.1 0.2 0.5 1.0
  const MatRM map = grid_of({0.5f, 0.1f, 0.3f, 0.1f}, 2, 2);
  SECTION("t = 0.6 keeps 0.5 and 0.3 (cumval > 0.4)") {
    const ThresholdResult t = keep_top_mass(map, 0.6f);
    CHECK(t.kept_patches == 2);
    CHECK(t.total_patches == 4);
    CHECK(t.kept_mass == Approx(0.8));
    CHECK(t.kept_map(0, 0) == 0.5f);
    CHECK(t.kept_map(1, 0) == 0.3f);
    CHECK(t.kept_map(0, 1) == 0.0f);
    CHECK(t.kept_map(1, 1) == 0.0f);
  }
  SECTION("t = 0.45 keeps only the largest (cumval 0.5 is not > 0.55)") {
    const ThresholdResult t = keep_top_mass(map, 0.45f);
    CHECK(t.kept_patches == 1);
    CHECK(t.kept_mass == Approx(0.5));
  }
  SECTION("t = 1 keeps everything") { CHECK(keep_top_mass(map, 1.0f).kept_patches == 4); }
  SECTION("an all-zero map keeps nothing and does not divide by zero") {
    const ThresholdResult t = keep_top_mass(MatRM::Zero(3, 3), 0.6f);
    CHECK(t.kept_patches == 0);
    CHECK(t.kept_mass == 0.0);
  }
}

// [SECTION] Working grid

TEST_CASE("viewer grid prediction matches prepare_image", "[viewer]") {
  const VitConfig config = test::small_config(224);
  for (const auto& [w, h] : std::vector<std::pair<int, int>>{{640, 480}, {224, 224}, {100, 37}, {1000, 999}, {33, 300}})
    for (int side : {64, 128, 224, 300, 512}) {
      cv::Mat rgb(h, w, CV_32FC3, cv::Scalar(0.5, 0.5, 0.5));
      const PreparedImage p = prepare_image(rgb, config, side);
      const GridPrediction g = predict_grid(w, h, config, side);
      INFO(w << "x" << h << " at " << side);
      CHECK(g.content_w == p.content_w);
      CHECK(g.content_h == p.content_h);
      CHECK(g.grid_w == p.grid.grid_w);
      CHECK(g.grid_h == p.grid.grid_h);
      CHECK(g.resized == p.resized);
      CHECK(g.tokens == 1 + p.grid.grid_w * p.grid.grid_h);
    }
}

// [SECTION] Head statistics and inspector

TEST_CASE("viewer head statistics agree with the full attention matrices", "[viewer]") {
  const VitConfig config = test::small_config(20, true, 2);
  const VitModel model = test::random_model(config, 5);
  cv::Mat rgb01;
  test_picture(18, 20).convertTo(rgb01, CV_32FC3, 1.0 / 255.0);  // 18 wide: the last column is padding
  const PreparedImage image = prepare_image(rgb01, config, 0);
  ForwardOptions options;
  options.keep_probs = true;
  const ForwardResult f = forward(model, image.grid, options);
  const ImageStats stats = head_statistics(model, f, image.grid.patch_is_padding, 0, {});

  const int gw = f.grid_w, patches = f.grid_h * f.grid_w;
  int queries = 0;
  for (int i = 0; i < patches; ++i) queries += image.grid.patch_is_padding[static_cast<size_t>(i)] ? 0 : 1;
  CHECK(stats.queries == queries);
  for (int l = 0; l < config.depth; ++l)
    for (int h = 0; h < config.num_heads; ++h) {
      const MatRM& probs = f.layers[static_cast<size_t>(l)].probs[static_cast<size_t>(h)];
      double entropy = 0.0, distance = 0.0;
      for (int q = 0; q < patches; ++q) {
        if (image.grid.patch_is_padding[static_cast<size_t>(q)]) continue;
        const int row = 1 + q;
        for (int j = 0; j < f.tokens; ++j)
          if (probs(row, j) > 0.0f) entropy -= probs(row, j) * std::log(static_cast<double>(probs(row, j)));
        double mass = 0.0, d = 0.0;
        for (int k = 0; k < patches; ++k) {
          const double dr = k / gw - q / gw, dc = k % gw - q % gw;
          d += probs(row, 1 + k) * 4.0 * std::sqrt(dr * dr + dc * dc);
          mass += probs(row, 1 + k);
        }
        distance += d / mass;
      }
      INFO("layer " << l << " head " << h);
      CHECK(stats.layers[static_cast<size_t>(l)][static_cast<size_t>(h)].entropy == Approx(entropy / queries).epsilon(1e-4));
      CHECK(stats.layers[static_cast<size_t>(l)][static_cast<size_t>(h)].mean_distance ==
            Approx(distance / queries).epsilon(1e-4));
    }
}

TEST_CASE("viewer head statistics of uniform attention have the closed form", "[viewer]") {
  // Zero query/key weights and biases: every score is 0, every row uniform over the N tokens.
  const VitConfig config = test::small_config(12, true, 1);
  TensorMap tensors = test::random_tensors(config, 3);
  for (auto& v : tensors.at("blocks.0.attn.qkv.weight").values) v = 0.0f;
  for (auto& v : tensors.at("blocks.0.attn.qkv.bias").values) v = 0.0f;
  const VitModel model = model_from_tensors(config, tensors, "uniform");
  cv::Mat rgb01(12, 12, CV_32FC3, cv::Scalar(0.2, 0.4, 0.6));
  const PreparedImage image = prepare_image(rgb01, config, 0);
  const ForwardResult f = forward(model, image.grid, ForwardOptions{});
  const ImageStats stats = head_statistics(model, f, image.grid.patch_is_padding, 0, {});
  // 3x3 grid, 10 tokens; mean over all patch pairs of the centre distance in pixels (P = 4).
  double pair_sum = 0.0;
  for (int q = 0; q < 9; ++q)
    for (int k = 0; k < 9; ++k) pair_sum += 4.0 * std::hypot(q / 3 - k / 3, q % 3 - k % 3);
  for (const HeadStats& s : stats.layers[0]) {
    CHECK(s.entropy == Approx(std::log(10.0)).epsilon(1e-5));
    CHECK(s.mean_distance == Approx(pair_sum / 81.0).epsilon(1e-5));
  }
}

TEST_CASE("viewer inspector reproduces one entry of the attention matrix step by step", "[viewer]") {
  const VitConfig config = test::small_config(16, true, 1);
  const VitModel model = test::random_model(config, 9);
  cv::Mat rgb01;
  test_picture(16, 16).convertTo(rgb01, CV_32FC3, 1.0 / 255.0);
  const PreparedImage image = prepare_image(rgb01, config, 0);
  ForwardOptions options;
  options.keep_probs = true;
  options.causal = true;
  const ForwardResult f = forward(model, image.grid, options);
  const int d = config.head_dim(), dim = config.embed_dim;
  for (const auto& [q, k] : std::vector<std::pair<int, int>>{{5, 3}, {7, 7}, {2, 9}, {0, 0}}) {
    const InspectorStep step = inspect_pair(model, f, image.grid, 0, q, k);
    CHECK(step.key_allowed == (k <= q));
    CHECK(step.query_patch.size() == (q == 0 ? 0u : 48u));
    if (q > 0) CHECK(step.query_patch[0] == image.grid.patches(q - 1, 0));
    for (int h = 0; h < config.num_heads; ++h) {
      const HeadStep& s = step.heads[static_cast<size_t>(h)];
      const MatRM& probs = f.layers[0].probs[static_cast<size_t>(h)];
      INFO("q " << q << " k " << k << " head " << h);
      CHECK(s.q.size() == static_cast<size_t>(d));
      CHECK(s.weight == Approx(probs(q, k)).margin(1e-6));
      CHECK(s.scaled == Approx(s.dot / std::sqrt(12.0f)).epsilon(1e-5));
      for (int c = 0; c < d; ++c) {
        CHECK(s.contribution[static_cast<size_t>(c)] == Approx(s.weight * s.v[static_cast<size_t>(c)]).margin(1e-6));
        double out = 0.0;  // (probs @ v) for this query: the head's output
        for (int j = 0; j < f.tokens; ++j) out += probs(q, j) * f.layers[0].qkv(j, 2 * dim + h * d + c);
        CHECK(s.output[static_cast<size_t>(c)] == Approx(out).margin(1e-5));
      }
    }
  }
}

// [SECTION] Script

TEST_CASE("viewer scripts parse, keep paths whole and name the bad line", "[viewer]") {
  const auto commands = parse_script(
      "# comment\n\npin 10 12\nmode received   # trailing comment\nopen /tmp/a folder/x y.png\nexport /tmp/out dir raw\n"
      "export /tmp/plain\nscale temperature 2.5\nthreshold off\nexample k 2 1 -3.5\n",
      "s.txt");
  REQUIRE(commands.size() == 8);
  CHECK(commands[0].verb == "pin");
  CHECK(commands[0].line == 3);
  CHECK(commands[0].args == std::vector<std::string>{"10", "12"});
  CHECK(commands[2].args == std::vector<std::string>{"/tmp/a folder/x y.png"});
  CHECK(commands[3].args == std::vector<std::string>{"/tmp/out dir", "raw"});
  CHECK(commands[4].args == std::vector<std::string>{"/tmp/plain"});
  CHECK(commands[7].args.size() == 4);

  auto error_of = [](const std::string& text) {
    try {
      parse_script(text, "s.txt");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(error_of("pin 1 2\nfly away\n"), Catch::Contains("s.txt:2:") && Catch::Contains("unknown command 'fly'"));
  CHECK_THAT(error_of("pin 1\n"), Catch::Contains("s.txt:1:") && Catch::Contains("pin ROW COL"));
  CHECK_THAT(error_of("colormap rainbowish\n"), Catch::Contains("viridis"));
  CHECK_THAT(error_of("alpha 1.5\n"), Catch::Contains("0 to 1"));
  CHECK_THAT(error_of("size 20\n"), Catch::Contains("64 to 512"));
  CHECK_THAT(error_of("example q 2 0 1\n"), Catch::Contains("q: 2x2"));
}

// [SECTION] Settings and file lists

TEST_CASE("viewer settings round-trip and survive a damaged file", "[viewer]") {
  const std::string dir = test::temp_dir("viewer-settings");
  const std::string path = dir + "/sub/settings.json";
  Settings s;
  s.colormap = "magma";
  s.alpha = 0.25f;
  s.window_w = 1000;
  s.window_h = 700;
  s.recent_images = {"/a.png", "/b.png"};
  s.recent_models = {"/m.safetensors"};
  save_settings(path, s);  // creates sub/
  std::string warning;
  const Settings back = load_settings(path, &warning);
  CHECK(warning.empty());
  CHECK(back.colormap == "magma");
  CHECK(back.alpha == 0.25f);
  CHECK(back.window_w == 1000);
  CHECK(back.recent_images == s.recent_images);
  CHECK(back.recent_models == s.recent_models);

  // A path in another encoding (Latin-1 bytes) cannot go into JSON: left out, the save goes on.
  Settings latin = s;
  latin.recent_images = {"/caf\xe9.png", "/b.png"};
  latin.last_folder = "/photos/\xe9t\xe9";
  save_settings(path, latin);
  const Settings kept = load_settings(path, &warning);
  CHECK(warning.empty());
  CHECK(kept.recent_images == std::vector<std::string>{"/b.png"});
  CHECK(kept.last_folder.empty());
  CHECK(kept.colormap == "magma");
  // Nested past the limit: not a settings object, the defaults (the parse never recurses).
  write_file_atomic(path, "{\"recent_images\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  warning.clear();
  CHECK(load_settings(path, &warning).recent_images.empty());
  CHECK_THAT(warning, Catch::Contains("using the defaults"));

  write_file_atomic(path, "{ not json");
  const Settings damaged = load_settings(path, &warning);
  CHECK_THAT(warning, Catch::Contains(path));
  CHECK(damaged.colormap == "viridis");

  write_file_atomic(path, R"({"alpha": "loud", "window_w": 5, "colormap": "jet"})");
  warning.clear();
  const Settings partial = load_settings(path, &warning);
  CHECK(warning.empty());
  CHECK(partial.alpha == 0.6f);     // wrong type: default
  CHECK(partial.window_w == 640);   // clamped
  CHECK(partial.colormap == "jet");
  // Numbers past int's range are clamped before they become ints (undefined behaviour before).
  write_file_atomic(path, R"({"window_w": 1e300, "window_h": -1e300, "alpha": 1e308})");
  const Settings huge = load_settings(path, &warning);
  CHECK(huge.window_w == 8192);
  CHECK(huge.window_h == 480);
  CHECK(huge.alpha == 0.6f);
  // A pipe at the settings' name: refused from stat with one warning (reading it blocked the
  // viewer before its window opened), left alone by the save.
  const std::string pipe_dir = test::temp_dir("settings-pipe"), pipe = pipe_dir + "/settings.json";
  REQUIRE(::mkfifo(pipe.c_str(), 0644) == 0);
  warning.clear();
  CHECK(load_settings(pipe, &warning).colormap == "viridis");
  CHECK_THAT(warning, Catch::Contains(pipe + ": is a pipe (FIFO)") && Catch::Contains("using the default settings"));
  CHECK_THROWS_WITH(save_settings(pipe, partial), pipe + ": is not a regular file; the settings were not saved");
  struct stat st {};
  REQUIRE(::lstat(pipe.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  // A link to settings kept elsewhere is written through and stays a link.
  const std::string target = pipe_dir + "/dotfiles-settings.json", link = pipe_dir + "/linked.json";
  REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
  save_settings(link, partial);
  REQUIRE(::lstat(link.c_str(), &st) == 0);
  CHECK(S_ISLNK(st.st_mode));
  CHECK(load_settings(target, nullptr).colormap == "jet");

  std::vector<std::string> recent = {"a", "b", "c"};
  remember_recent(recent, "b");
  CHECK(recent == std::vector<std::string>{"b", "a", "c"});
  for (int i = 0; i < 20; ++i) remember_recent(recent, std::to_string(i));
  CHECK(recent.size() == kMaxRecent);
  CHECK(recent.front() == "19");

  const char* old = std::getenv("XDG_CONFIG_HOME");
  const std::string saved = old ? old : "";
  ::setenv("XDG_CONFIG_HOME", dir.c_str(), 1);
  CHECK(settings_folder() == dir + "/vitlens");
  if (old) ::setenv("XDG_CONFIG_HOME", saved.c_str(), 1);
  else ::unsetenv("XDG_CONFIG_HOME");
  fs::remove_all(dir);
}

TEST_CASE("viewer file lists: folders first, filtered by extension, hidden left out", "[viewer]") {
  const std::string dir = test::temp_dir("viewer-files");
  fs::create_directory(dir + "/zeta");
  fs::create_directory(dir + "/alpha");
  fs::create_directory(dir + "/.hidden");
  for (const char* name : {"b.PNG", "a.jpg", "notes.txt", "m.safetensors", ".secret.png"}) std::ofstream(dir + "/" + name) << "x";
  const FolderListing images = list_folder(dir, image_extensions(), false);
  CHECK(images.error.empty());
  REQUIRE(images.entries.size() == 4);
  CHECK(images.entries[0] == std::make_pair(std::string("alpha"), true));
  CHECK(images.entries[1] == std::make_pair(std::string("zeta"), true));
  CHECK(images.entries[2] == std::make_pair(std::string("a.jpg"), false));
  CHECK(images.entries[3] == std::make_pair(std::string("b.PNG"), false));
  const FolderListing models = list_folder(dir, model_extensions(), false);
  CHECK(models.entries.size() == 3);
  CHECK(list_folder(dir, {}, false).entries.size() == 6);
  CHECK(list_folder(dir, {}, true).entries.size() == 2);
  CHECK_FALSE(list_folder(dir + "/missing", {}, false).error.empty());
  CHECK(parent_folder(dir + "/alpha") == dir);
  CHECK(parent_folder("/") == "/");
  fs::remove_all(dir);
}

// [SECTION] The app without a window

TEST_CASE("viewer pictures and export are core's export for the same settings", "[viewer]") {
  Fixture fx;
  App app;
  start_app(app, fx.image_path, fx.model_path);
  REQUIRE(run_until_idle(app));
  REQUIRE(app.doc.ready());
  CHECK(app.ui.view.query_row == 4);  // pinned at the centre of the 8x8 grid
  // A newcomer first sees where the centre patch looks (query mode), where heads show their role.
  CHECK(app.ui.view.mode == MapMode::Query);
  CHECK_THAT(cli_command(app, "out"), Catch::Contains("--patch 4,4"));

  pin_query(app, 2, 5);
  app.ui.display.style.colormap = "inferno";
  app.ui.display.normalize = Normalize::Log;
  app.ui.compute.mask = MaskMode::Causal;
  app.ui.view.layer = 0;
  REQUIRE(run_until_idle(app));

  // The same through core's analyse_image: the pictures must be identical.
  const VitModel model = load_model(fx.model_path);
  ExportSettings s;
  s.select = QuerySelect::Patch;
  s.patch_row = 2;
  s.patch_col = 5;
  s.layer = 0;
  s.causal = true;
  s.style.colormap = "inferno";
  s.normalize = Normalize::Log;
  const ImageAnalysis reference = analyse_image(model, fx.image_path, s);
  const ExportImages expected = render_export_images(model, reference, s.style, s.normalize);
  REQUIRE(app.derived.pictures.heads.size() == 4);
  for (size_t h = 0; h < 4; ++h) CHECK(same_bytes(app.derived.pictures.heads[h], expected.heads[h]));
  CHECK(same_bytes(app.derived.pictures.mean, expected.mean));
  CHECK(same_bytes(app.derived.pictures.montage, expected.montage));
  CHECK(cli_equivalent(app));

  // Exported files equal export_attention's, byte for byte except the timings.
  const std::string viewer_dir = fx.dir + "/viewer", cli_dir = fx.dir + "/cli";
  fs::create_directory(viewer_dir);
  fs::create_directory(cli_dir);
  app.ui.export_raw = true;
  app.requests.export_folder = viewer_dir;
  REQUIRE(run_until_idle(app));
  CHECK_FALSE(app.ui.message.error);
  s.out_dir = cli_dir;
  s.raw = true;
  export_attention(model, fx.image_path, s);
  for (const char* name : {"picture_head0.png", "picture_head3.png", "picture_mean.png", "picture_montage.png",
                           "picture_attn.npy"}) {
    INFO(name);
    REQUIRE(fs::exists(viewer_dir + "/" + name));
    CHECK(read_text(viewer_dir + "/" + name) == read_text(cli_dir + "/" + name));
  }
  auto json_without_timings = [](const std::string& path) {
    nlohmann::json j = nlohmann::json::parse(read_text(path));
    j.erase("timings_ms");
    j.erase("set");  // each export's own id
    for (auto& f : j["files"]) f = fs::path(f.get<std::string>()).filename().string();
    return j;
  };
  CHECK(json_without_timings(viewer_dir + "/picture.json") == json_without_timings(cli_dir + "/picture.json"));
  CHECK_FALSE(fs::exists(viewer_dir + "/picture_view.json"));  // nothing viewer-only was on
}

TEST_CASE("viewer keeps the current image and model when a file is bad", "[viewer]") {
  Fixture fx;
  App app;
  start_app(app, fx.image_path, fx.model_path);
  REQUIRE(run_until_idle(app));
  const auto image_before = app.doc.image;
  const auto model_before = app.doc.model;
  const uint64_t pictures_before = app.derived.pictures_version;

  const std::string bad_image = fx.dir + "/bad.png", bad_model = fx.dir + "/bad.safetensors";
  write_file_atomic(bad_image, "this is not a picture");
  write_file_atomic(bad_model, std::string("\x08\0\0\0\0\0\0\0{}", 10));
  for (const std::string& path : {bad_image, fx.dir + "/missing.png"}) {
    app.requests.open_image = path;
    REQUIRE(run_until_idle(app));
    CHECK(app.ui.message.error);
    CHECK_THAT(app.ui.message.text, Catch::Contains(path));
    CHECK(app.doc.image == image_before);
    CHECK(app.derived.pictures_version == pictures_before);
  }
  app.requests.open_model = bad_model;
  REQUIRE(run_until_idle(app));
  CHECK(app.ui.message.error);
  CHECK(app.doc.model == model_before);
  CHECK(app.ui.recent_images == std::vector<std::string>{fs::path(fx.image_path).lexically_normal().string()});

    // A model in a Train window's temporary folder, this viewer's or another's, opens and is not
  // remembered: the folder goes with its window.
  const std::string other_session = TrainSession::temporary_parent() + "/vitlens-train-" + std::to_string(test::gone_pid());
  REQUIRE(fs::create_directories(other_session));
  fs::copy_file(fx.model_path, other_session + "/current.safetensors");
  const std::vector<std::string> recent_before = app.ui.recent_models;
  app.requests.open_model = other_session + "/current.safetensors";
  REQUIRE(run_until_idle(app));
  CHECK_FALSE(app.ui.message.error);
  CHECK(app.doc.model->path == other_session + "/current.safetensors");
  CHECK(app.ui.recent_models == recent_before);
  fs::remove_all(other_session);
  app.requests.open_model = fx.model_path;
  REQUIRE(run_until_idle(app));
  CHECK(app.ui.recent_models.front() == fs::path(fx.model_path).lexically_normal().string());

  // A good one afterwards replaces the image, keeps the query in the same place of the picture.
  pin_query(app, 7, 7);
  app.requests.open_image = fx.wide_path;
  REQUIRE(run_until_idle(app));
  CHECK_FALSE(app.ui.message.error);
  CHECK(app.doc.image->path == fx.wide_path);
  CHECK(grid_rows(app) == 5);  // 50x30 at the model's 32: 32x19 -> 5x8 patches
  CHECK(grid_cols(app) == 8);
  CHECK(app.ui.view.query_row == 4);  // (7.5 / 8) of the way down and across, on the new grid
  CHECK(app.ui.view.query_col == 7);
  CHECK(app.ui.recent_images.front() == fx.wide_path);
}

TEST_CASE("viewer actions: pin clamps, keys move, painting masks keys, scale and size recompute", "[viewer]") {
  Fixture fx;
  App app;
  start_app(app, fx.image_path, fx.model_path);
  REQUIRE(run_until_idle(app));
  // Screen to patch: a 8x8 grid of 4-pixel patches drawn 320 px wide at (100, 50).
  const Rect picture{100.0f, 50.0f, 320.0f, 320.0f};
  int row = 0, col = 0, px = 0, py = 0;
  REQUIRE(patch_under(app, picture, 100.0f, 50.0f, row, col, px, py));
  CHECK((row == 0 && col == 0 && px == 0 && py == 0));
  REQUIRE(patch_under(app, picture, 100.0f + 319.9f, 50.0f + 45.0f, row, col, px, py));
  CHECK((row == 1 && col == 7 && px == 31 && py == 4));
  CHECK_FALSE(patch_under(app, picture, 99.0f, 60.0f, row, col, px, py));
  CHECK_FALSE(patch_under(app, picture, 200.0f, 370.0f, row, col, px, py));

  pin_query(app, 100, -3);
  CHECK(app.ui.view.query_row == 7);
  CHECK(app.ui.view.query_col == 0);
  move_query(app, 0, -1);
  CHECK(app.ui.view.query_col == 0);
  move_query(app, -1, 1);
  CHECK(app.ui.view.query_row == 6);
  CHECK(app.ui.view.query_col == 1);

  // A new query needs no forward pass: one update redraws every head for it (same frame).
  const uint64_t version = app.derived.pictures_version;
  pin_query(app, 3, 3);
  update_derived(app);
  CHECK(app.derived.pictures_version == version + 1);
  CHECK(app.derived.view.request.query_token == 1 + 3 * 8 + 3);
  CHECK(is_idle(app));

  // Paint key patch (0, 0): no query may attend to it any more.
  paint_patch(app, 0, 0, true);
  CHECK(app.ui.compute.mask == MaskMode::Painted);
  REQUIRE(run_until_idle(app));
  CHECK(app.doc.comp->key.painted.size() == 64);
  for (const MatRM& m : app.derived.raw_maps.heads) CHECK(m(0, 0) == 0.0f);
  CHECK_FALSE(cli_equivalent(app));

  // A new image (even of the same size) starts with no painted patches.
  {
    const std::string again = fx.dir + "/again.png";
    write_png_atomic(again, test_picture(32, 32));
    App other;
    start_app(other, fx.image_path, fx.model_path);
    REQUIRE(run_until_idle(other));
    paint_patch(other, 1, 2, true);
    REQUIRE(run_until_idle(other));
    REQUIRE(other.doc.comp->key.painted.size() == 64);
    other.requests.open_image = again;
    REQUIRE(run_until_idle(other));
    CHECK(other.doc.image->path == again);
    CHECK(other.ui.compute.painted.empty());
    CHECK(other.doc.comp->key.painted.empty());
  }

  // Without the 1/sqrt(d) scale the scores are sqrt(12) times larger.
  ScriptCommand c;
  c.verb = "scale";
  c.args = {"none"};
  CHECK(apply_script_command(app, c).empty());
  REQUIRE(run_until_idle(app));
  CHECK(app.doc.comp->forward.score_scale == 1.0f);
  c.args = {"temperature", "2"};
  CHECK(apply_script_command(app, c).empty());
  REQUIRE(run_until_idle(app));
  CHECK(app.doc.comp->forward.score_scale == Approx(1.0 / (std::sqrt(12.0) * 2.0)));
  // A temperature is `vitlens export --temperature`: the export is the CLI's, no viewer-only notes.
  CHECK(viewer_only_settings(app) == "the mask 'painted'");  // the mask painted above
  set_mask(app, MaskMode::Padding);
  REQUIRE(run_until_idle(app));
  CHECK(cli_equivalent(app));
  CHECK(viewer_only_settings(app).empty());
  CHECK_THAT(cli_command(app, "out"), Catch::Contains("--temperature 2"));
  c.args = {"none"};
  CHECK(apply_script_command(app, c).empty());
  REQUIRE(run_until_idle(app));
  CHECK(viewer_only_settings(app) == "no softmax scale");
  CHECK_FALSE(cli_equivalent(app));

  // Script errors name the problem; the state is untouched.
  c.verb = "pin";
  c.args = {"8", "0"};
  CHECK_THAT(apply_script_command(app, c), Catch::Contains("outside the 8x8 patch grid"));
  c.verb = "layer";
  c.args = {"2"};
  CHECK_THAT(apply_script_command(app, c), Catch::Contains("2 layer(s)"));

  // The received mode and the threshold: the kept share is reported per map.
  app.ui.view.mode = MapMode::Received;
  app.ui.display.threshold_on = true;
  app.ui.display.threshold = 0.5f;
  update_derived(app);
  REQUIRE(app.derived.kept.size() == 5);
  for (const ThresholdResult& t : app.derived.kept) CHECK(t.kept_mass >= 0.5);
  // Each tile's entropy is the attention's own, whatever the threshold keeps of it for drawing.
  REQUIRE(app.derived.entropy.size() == 5);
  for (size_t h = 0; h < 4; ++h) CHECK(app.derived.entropy[h] == map_entropy(app.derived.raw_maps.heads[h]));
  CHECK(app.derived.entropy[4] == map_entropy(app.derived.raw_maps.mean));
}

TEST_CASE("viewer worked example reproduces the seed's numbers", "[viewer]") {
  App app;
  update_derived(app);
  REQUIRE(app.derived.example_valid);
  const MatRM& w = app.derived.example.weights;
  const MatRM& c = app.derived.example.context;
  // weights [[0.401, 0.401, 0.198], [0.198, 0.401, 0.401]], context [[4.011, 2.203], [1.978, 2.407]]
  CHECK(w(0, 0) == Approx(0.401).margin(5e-4));
  CHECK(w(0, 2) == Approx(0.198).margin(5e-4));
  CHECK(w(1, 0) == Approx(0.198).margin(5e-4));
  CHECK(c(0, 0) == Approx(4.011).margin(5e-4));
  CHECK(c(0, 1) == Approx(2.203).margin(5e-4));
  CHECK(c(1, 0) == Approx(1.978).margin(5e-4));
  CHECK(c(1, 1) == Approx(2.407).margin(5e-4));
  CHECK(app.derived.example.scores(0, 1) == Approx(1.0 / std::sqrt(2.0)));
  app.ui.example.scaled = false;
  update_derived(app);
  CHECK(app.derived.example.scores(0, 1) == Approx(1.0));
}

// [SECTION] What the Controls window says

TEST_CASE("viewer map modes each say what they show", "[viewer]") {
  App app;
  std::set<std::string> captions;
  for (MapMode m : {MapMode::Query, MapMode::ClassToken, MapMode::Received}) {
    app.ui.view.mode = m;
    captions.insert(map_mode_caption(app));
  }
  set_rollout(app, true);
  captions.insert(map_mode_caption(app));
  CHECK(captions.size() == 4);
  for (const std::string& c : captions) CHECK(c.size() > 40);
}

TEST_CASE("viewer lays its windows out again when the display is resized", "[viewer]") {
  LayoutState layout;
  note_display_size(layout, 1440, 900);
  CHECK(layout.generation == 0);  // the first frame: first use, an imgui.ini may place the windows
  note_display_size(layout, 1440, 900);
  CHECK(layout.generation == 0);
  note_display_size(layout, 1280, 720);
  CHECK(layout.generation == 1);
  CHECK(layout.display_w == 1280);
}

TEST_CASE("viewer working size of a model smaller than the slider's usual minimum is its own", "[viewer]") {
  // A 28 px model (Fashion-MNIST) computes at 28 px; the Controls line and the status bar both
  // read that one number (working_side) and the pass made with it.
  Fixture fx;
  const std::string small_path = fx.dir + "/small.safetensors";
  VitConfig config = test::small_config(28, true, 2);
  save_model(small_path, config, test::random_tensors(config, 3));
  App app;
  start_app(app, fx.image_path, small_path);
  REQUIRE(run_until_idle(app));
  REQUIRE(app.doc.ready());
  CHECK(working_side(app.doc.model->model.config, app.ui.compute) == 28);
  CHECK(app.doc.comp->key.max_side == 28);
  CHECK(app.doc.comp->image.padded_w == 28);
}

// [SECTION] Threshold through core

TEST_CASE("viewer threshold is core's: same kept maps and JSON as export --threshold, flat maps say so", "[viewer]") {
  Fixture fx;
  const std::string grey_path = fx.dir + "/grey.png";
  write_png_atomic(grey_path, cv::Mat(32, 32, CV_8UC3, cv::Scalar(128, 128, 128)));
  const VitModel model = load_model(fx.model_path);
  App app;
  start_app(app, fx.image_path, fx.model_path);
  REQUIRE(run_until_idle(app));
  app.ui.display.threshold_on = true;
  app.ui.display.threshold = 0.5f;
  REQUIRE(run_until_idle(app));
  CHECK(cli_equivalent(app));  // the threshold is a CLI flag now
  CHECK_THAT(cli_command(app, "out"), Catch::Contains("--threshold 0.5"));

  ExportSettings s;  // the centre patch's query, the last layer, as the viewer starts
  s.select = QuerySelect::Patch;
  s.patch_row = app.ui.view.query_row;
  s.patch_col = app.ui.view.query_col;
  s.threshold = 0.5f;
  const ImageAnalysis reference = analyse_image(model, fx.image_path, s);
  REQUIRE(app.derived.kept.size() == reference.kept.size());
  for (size_t i = 0; i < reference.kept.size(); ++i) {
    CHECK(app.derived.kept[i].kept_patches == reference.kept[i].kept_patches);
    CHECK_FALSE(app.derived.kept[i].no_structure);
  }
  for (size_t h = 0; h < reference.maps.heads.size(); ++h)
    CHECK((app.derived.view.maps.heads[h].array() == reference.maps.heads[h].array()).all());

  const std::string viewer_dir = fx.dir + "/viewer_t", cli_dir = fx.dir + "/cli_t";
  fs::create_directory(viewer_dir);
  fs::create_directory(cli_dir);
  app.requests.export_folder = viewer_dir;
  REQUIRE(run_until_idle(app));
  s.out_dir = cli_dir;
  export_attention(model, fx.image_path, s);
  auto without_timings = [](const std::string& path) {
    nlohmann::json j = nlohmann::json::parse(read_text(path));
    j.erase("timings_ms");
    j.erase("set");  // each export's commit id
    for (auto& f : j["files"]) f = fs::path(f.get<std::string>()).filename().string();
    return j;
  };
  const nlohmann::json viewer_json = without_timings(viewer_dir + "/picture.json");
  CHECK(viewer_json == without_timings(cli_dir + "/picture.json"));
  CHECK(viewer_json["threshold"]["mass"] == 0.5);
  CHECK(read_text(viewer_dir + "/picture_montage.png") == read_text(cli_dir + "/picture_montage.png"));

  // A flat image's class-token maps under the bundled designed model (whose class token weighs
  // identical patches alike) have nothing to keep: every result says no structure.
  app.requests.open_model = default_model_path();
  app.requests.open_image = grey_path;
  REQUIRE(run_until_idle(app));
  app.ui.view.mode = MapMode::ClassToken;
  REQUIRE(run_until_idle(app));
  REQUIRE(app.derived.kept.size() == 5);
  for (const ThresholdResult& t : app.derived.kept) {
    CHECK(t.no_structure);
    CHECK(t.kept_patches == t.total_patches);
  }

  // A mass outside (0, 1] (no slider gives one: they clamp what is typed) is said above the heads,
  // the maps drawn whole; the next good mass clears the message.
  app.ui.view.mode = MapMode::Query;
  app.ui.display.threshold = 0.0f;
  REQUIRE(run_until_idle(app));
  CHECK(app.derived.picture_error == "threshold mass must be in (0, 1], got 0.000000");
  CHECK(app.derived.kept.empty());
  CHECK((app.derived.view.maps.heads[0].array() == app.derived.raw_maps.heads[0].array()).all());
  app.ui.display.threshold = 0.5f;
  REQUIRE(run_until_idle(app));
  CHECK(app.derived.picture_error == "");
  CHECK(app.derived.kept.size() == 5);
}

// [SECTION] Status bar, folders, browser, widgets and real-input commands

namespace {

// Sets an environment variable for one scope and puts the old value back.
struct ScopedEnv {
  std::string name, old;
  bool had = false;
  ScopedEnv(const char* n, const std::string& value) : name(n) {
    const char* v = std::getenv(n);
    had = v != nullptr;
    if (had) old = v;
    ::setenv(n, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had) ::setenv(name.c_str(), old.c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

WidgetInfo widget(const std::string& label, const std::string& window, std::vector<std::string> sections, WidgetKind kind,
                  uint32_t id) {
  WidgetInfo w;
  w.label = w.id_label = label;
  w.window = window;
  w.sections = std::move(sections);
  w.kind = kind;
  w.id = id;
  w.rect = w.frame = Rect{10.0f, 20.0f, 100.0f, 20.0f};
  return w;
}

}  // namespace

TEST_CASE("viewer status bar shows the grid of the pass on screen, after the working size changes", "[viewer]") {
  Fixture fx;
  const std::string big = fx.dir + "/big.png";
  write_png_atomic(big, test_picture(128, 128));
  App app;
  start_app(app, big, fx.model_path);
  REQUIRE(run_until_idle(app));
  // The model's own size (32): 128 px scaled to 32, an 8x8 grid.
  CHECK_THAT(status_text(app), Catch::Contains("grid 8x8, 65 tokens"));
  app.ui.compute.max_side = 64;  // what releasing the working-size slider does
  REQUIRE(run_until_idle(app));
  CHECK(grid_rows(app) == 16);
  CHECK_THAT(status_text(app), Catch::Contains("grid 16x16, 257 tokens"));
  CHECK_THAT(status_text(app), Catch::Contains("64x64 px"));
  // Nothing on screen says the old grid any more.
  CHECK(app.ui.message.text.find("8x8") == std::string::npos);
  CHECK(state_json(app)["status"].get<std::string>().find("16x16") != std::string::npos);
}

TEST_CASE("viewer export folder: $VITLENS_EXPORT_DIR or ~/vitlens-exports, created on demand, full path said",
          "[viewer]") {
  Fixture fx;
  {
    ScopedEnv home("HOME", fx.dir + "/home");
    ScopedEnv unset("VITLENS_EXPORT_DIR", "");
    CHECK(default_export_folder() == fx.dir + "/home/vitlens-exports");
  }
  const std::string exports = fx.dir + "/exports";
  ScopedEnv env("VITLENS_EXPORT_DIR", exports + "/");
  CHECK(default_export_folder() == exports);
  App app;
  start_app(app, fx.image_path, fx.model_path);
  REQUIRE(run_until_idle(app));
  CHECK(app.ui.export_folder == exports);
  CHECK(app.ui.screenshot_path == exports + "/vitlens-screenshot.png");
  REQUIRE_FALSE(fs::exists(exports));
  app.requests.export_folder = app.ui.export_folder;  // the Export button
  REQUIRE(run_until_idle(app));
  CHECK_FALSE(app.ui.message.error);
  CHECK(fs::exists(exports + "/picture_montage.png"));
  CHECK_THAT(app.ui.message.text, Catch::StartsWith("Exported 7 files (") && Catch::EndsWith(") into " + exports));

  // A relative folder is reported absolute; a missing folder that is not the default is an error.
  const fs::path cwd = fs::current_path();
  fs::current_path(fx.dir);
  fs::create_directory(fx.dir + "/rel");
  app.requests.export_folder = "rel";
  REQUIRE(run_until_idle(app));
  CHECK_THAT(app.ui.message.text, Catch::StartsWith("Exported 7 files (") && Catch::EndsWith(") into " + fx.dir + "/rel"));
  app.requests.export_folder = "missing/deeper";
  REQUIRE(run_until_idle(app));
  fs::current_path(cwd);
  CHECK(app.ui.message.error);
  CHECK_THAT(app.ui.message.text, Catch::Contains(fx.dir + "/missing/deeper: no such folder"));
  std::ofstream(fx.dir + "/a_file") << "the user's";
  app.requests.export_folder = fx.dir + "/a_file";
  REQUIRE(run_until_idle(app));
  CHECK(app.ui.message.error);
  CHECK_THAT(app.ui.message.text, Catch::Contains(fx.dir + "/a_file: is not a folder"));
  CHECK(read_text(fx.dir + "/a_file") == "the user's");
  CHECK_FALSE(fs::exists(fx.dir + "/missing"));
  CHECK_THROWS_WITH(check_output_path(fx.dir + "/nowhere/w.json", "--dump-widgets"), Catch::Contains("does not exist"));
  CHECK_NOTHROW(check_output_path(fx.dir + "/w.json", "--dump-widgets"));
}

TEST_CASE("viewer screenshots never replace a file the window did not save", "[viewer][trust]") {
  const std::string dir = test::temp_dir("viewer-shots");
  App app;
  const cv::Mat first(8, 8, CV_8UC3, cv::Scalar(10, 20, 30)), second(8, 8, CV_8UC3, cv::Scalar(200, 100, 0));
  // The user's picture, its name typed as the screenshot's: refused, the picture untouched.
  const std::string picture = dir + "/my_drawing.png";
  REQUIRE(cv::imwrite(picture, second));
  const std::string before = read_text(picture);
  save_screenshot(app, picture, first);
  CHECK(app.ui.message.error);
  CHECK_THAT(app.ui.message.text, Catch::Contains(picture + ": exists and is not a screenshot this window saved"));
  CHECK(read_text(picture) == before);
  // A new name is written; saved again to the same name it is replaced (it is this window's).
  const std::string shot = dir + "/shot.png";
  save_screenshot(app, shot, first);
  CHECK_FALSE(app.ui.message.error);
  save_screenshot(app, shot, second);
  CHECK_FALSE(app.ui.message.error);
  CHECK(cv::imread(shot).at<cv::Vec3b>(0, 0) == cv::Vec3b(0, 100, 200));  // BGR of the second
  // The default name, taken by an earlier session's screenshot, is numbered on.
  const std::string default_name = dir + "/vitlens-screenshot.png";
  REQUIRE(cv::imwrite(default_name, second));
  const std::string earlier = read_text(default_name);
  save_screenshot(app, default_name, first);
  CHECK_FALSE(app.ui.message.error);
  CHECK(read_text(default_name) == earlier);
  CHECK(fs::exists(dir + "/vitlens-screenshot_2.png"));
  CHECK_THAT(app.ui.message.text, Catch::EndsWith(dir + "/vitlens-screenshot_2.png"));
  // The user's file in place of a screenshot this window wrote (deleted and made again) is theirs.
  fs::remove(shot);
  REQUIRE(cv::imwrite(shot, second));
  const std::string users = read_text(shot);
  save_screenshot(app, shot, first);
  CHECK(app.ui.message.error);
  CHECK(read_text(shot) == users);
  for (const auto& entry : fs::directory_iterator(dir)) CHECK(entry.path().filename().string()[0] != '.');  // no temporaries

  // Names: a PNG is named .png (added to a name without an extension, any other refused), a
  // folder (or a name ending in '/') is said to be one; nothing is written for a refused name.
  const std::vector<std::string> before_names = test::entries(dir);
  for (const std::string& bad : {dir + "/photo.jpg", dir + "/shot.PNG.txt", dir, dir + "/newname/"}) {
    INFO(bad);
    save_screenshot(app, bad, first);
    CHECK(app.ui.message.error);
    const bool folder = bad == dir || bad.back() == '/';
    CHECK_THAT(app.ui.message.text, Catch::Contains(folder ? ": is a folder; a screenshot needs a file name"
                                                           : ": a screenshot is a PNG file; give the name the extension .png"));
    CHECK(test::entries(dir) == before_names);
  }
  save_screenshot(app, dir + "/no-extension", first);
  CHECK_FALSE(app.ui.message.error);
  CHECK(app.ui.message.text == "Saved the screenshot to " + dir + "/no-extension.png");
  CHECK(cv::imread(dir + "/no-extension.png").at<cv::Vec3b>(0, 0) == cv::Vec3b(30, 20, 10));
  save_screenshot(app, dir + "/upper.PNG", first);
  CHECK(app.ui.message.text == "Saved the screenshot to " + dir + "/upper.PNG");
  CHECK_THROWS_WITH(screenshot_path(dir + "/"), dir + "/: is a folder; a screenshot needs a file name (such as vitlens-screenshot.png)");
  CHECK_THROWS_WITH(screenshot_path(""), "no file name given for the screenshot (such as vitlens-screenshot.png)");
}

TEST_CASE("viewer export never replaces a file vitlens did not write, it names the file", "[viewer][trust]") {
  Fixture fx;
  App app;
  start_app(app, fx.image_path, fx.model_path);
  REQUIRE(run_until_idle(app));
  const std::string folder = fx.dir + "/annotated";
  fs::create_directory(folder);
  const std::string annotation = R"({"shapes": [{"label": "cat"}], "imagePath": "picture.png"})";
  std::ofstream(folder + "/picture.json") << annotation;
  app.requests.export_folder = folder;
  REQUIRE(run_until_idle(app));
  CHECK(app.ui.message.error);
  CHECK_THAT(app.ui.message.text, Catch::Contains(folder + "/picture.json") && Catch::Contains("did not write") &&
                                      Catch::Contains("another folder"));
  CHECK(read_text(folder + "/picture.json") == annotation);
  CHECK_FALSE(fs::exists(folder + "/picture_montage.png"));
  // Its own export, once there, is replaced as before.
  fs::remove(folder + "/picture.json");
  app.requests.export_folder = folder;
  REQUIRE(run_until_idle(app));
  CHECK_FALSE(app.ui.message.error);
  app.requests.export_folder = folder;
  REQUIRE(run_until_idle(app));
  CHECK_FALSE(app.ui.message.error);
}

TEST_CASE("viewer export of an image named like one of its outputs takes the next stem, as the CLI", "[viewer][trust]") {
  Fixture fx;
  // A PNG named picture.json (its stem's record name) exported into its own folder: the outputs go
  // to picture_2*, the image is never replaced (the viewer refused the export before).
  const std::string image = fx.dir + "/picture.json";
  fs::copy_file(fx.image_path, image);
  fs::remove(fx.image_path);
  const std::string before = read_text(image);
  App app;
  start_app(app, image, fx.model_path);
  REQUIRE(run_until_idle(app));
  REQUIRE(app.doc.ready());
  app.requests.export_folder = fx.dir;
  REQUIRE(run_until_idle(app));
  CHECK_FALSE(app.ui.message.error);
  CHECK(read_text(image) == before);
  CHECK(fs::exists(fx.dir + "/picture_2_montage.png"));
  CHECK(fs::exists(fx.dir + "/picture_2.json"));
  CHECK_FALSE(fs::exists(fx.dir + "/picture_montage.png"));
  // Exported again: the same stem, its own files replaced, the image still untouched.
  app.requests.export_folder = fx.dir;
  REQUIRE(run_until_idle(app));
  CHECK_FALSE(app.ui.message.error);
  CHECK(read_text(image) == before);
  CHECK_FALSE(fs::exists(fx.dir + "/picture_3.json"));
}

TEST_CASE("viewer worker queues an export once while the same export waits, a different one or a later one runs",
          "[viewer]") {
  Fixture fx;
  auto model = std::make_shared<LoadedModel>();
  model->model = load_model(fx.model_path);
  model->path = fx.model_path;
  model->serial = 1;
  const std::string out = fx.dir + "/out", other = fx.dir + "/other";
  fs::create_directory(out);
  fs::create_directory(other);
  ExportJob job;  // what the Export button submits
  job.model = model;
  job.settings.out_dir = out;
  job.analysis = analyse_image(model->model, fx.image_path, job.settings);
  job.options = forward_options_for(model->model, job.settings);
  job.same_files = "the view on screen, into out";  // start_export's key: the pass, command and notes
  ExportJob elsewhere = job;
  elsewhere.settings.out_dir = other;
  elsewhere.same_files = "the view on screen, into other";

  // A long pass keeps the worker busy, so the exports wait: 128 x 128 patches at 512 px, which
  // runs for seconds unless a newer compute cancels it.
  auto big = std::make_shared<SourceImage>();
  cv::Mat rgb01;
  test_picture(512, 512).convertTo(rgb01, CV_32FC3, 1.0 / 255.0);
  big->pixels = LoadedImage{rgb01, 512, 512};
  big->serial = 2;
  ComputeJob slow;
  slow.model = model;
  slow.image = big;
  slow.choice.max_side = 512;
  Worker worker;
  worker.submit(slow);
  const auto t0 = std::chrono::steady_clock::now();
  const auto waited = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  while (worker.activity() != "forward pass" && waited() < 30.0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(worker.activity() == "forward pass");

  const uint64_t first = worker.submit(job);
  const uint64_t again = worker.submit(job);  // a second click on Export
  const uint64_t different = worker.submit(elsewhere);
  CHECK(again == first);
  CHECK(different != first);
  worker.submit(ComputeJob{});  // cancels the long pass; loads nothing and computes nothing

  std::vector<ExportResult> results;
  const auto run_all = [&] {
    while (worker.busy() && waited() < 60.0) {
      for (ExportResult& r : worker.take_export_results()) results.push_back(std::move(r));
      worker.take_compute_results();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    for (ExportResult& r : worker.take_export_results()) results.push_back(std::move(r));
  };
  run_all();
  REQUIRE(results.size() == 2);  // one run of the twice-asked export, one of the other
  CHECK(results[0].job == first);
  CHECK(results[0].error.empty());
  CHECK(results[1].job == different);
  CHECK(fs::exists(out + "/picture_montage.png"));
  CHECK(fs::exists(other + "/picture_montage.png"));

  // Asked again once it ran: it runs again (an export asked for is written).
  results.clear();
  const uint64_t later = worker.submit(job);
  CHECK(later != first);
  run_all();
  REQUIRE(results.size() == 1);
  CHECK(results[0].job == later);
  CHECK(results[0].error.empty());

  // Through the Export button's path: the same view asked twice while the worker is busy is one
  // job and says so; another folder, or the view changed, is another job.
  App app;
  start_app(app, fx.image_path, fx.model_path);
  REQUIRE(run_until_idle(app));
  REQUIRE(app.doc.ready());
  app.worker.submit(slow);
  const auto t1 = std::chrono::steady_clock::now();
  while (app.worker.activity() != "forward pass" &&
         std::chrono::steady_clock::now() - t1 < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(app.worker.activity() == "forward pass");
  start_export(app, out);
  CHECK(app.ui.message.text == "Exporting to " + out + " ...");
  start_export(app, out);
  CHECK(app.ui.message.text == "The same export to " + out + " is already waiting to be written");
  CHECK(app.export_jobs.size() == 1);
  start_export(app, other);
  CHECK(app.export_jobs.size() == 2);
  app.ui.display.style.colormap = "magma";
  start_export(app, out);
  CHECK(app.export_jobs.size() == 3);
  app.worker.submit(ComputeJob{});  // cancels the long pass
  REQUIRE(run_until_idle(app));
  CHECK(app.export_failures == 0);

  // The window closed with exports waiting behind a long pass: finish_exports writes them and
  // says each one's outcome (a refused one counts as a failure).
  const std::string refused = fx.dir + "/refused";
  fs::create_directory(refused);
  test::spit(refused + "/picture.json", "the user's notes");
  app.ui.display.style.colormap = "viridis";
  app.worker.submit(slow);
  const auto t2 = std::chrono::steady_clock::now();
  while (app.worker.activity() != "forward pass" && std::chrono::steady_clock::now() - t2 < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(app.worker.activity() == "forward pass");
  fs::remove_all(other);
  fs::create_directory(other);
  start_export(app, other);
  start_export(app, refused);
  REQUIRE(app.export_jobs.size() == 2);
  std::vector<std::pair<std::string, bool>> said;
  finish_exports(app, [&](const std::string& text, bool error) { said.emplace_back(text, error); });
  CHECK(app.export_jobs.empty());
  REQUIRE(said.size() == 2);
  CHECK_THAT(said[0].first, Catch::StartsWith("Exported ") && Catch::EndsWith(") into " + other));
  CHECK_FALSE(said[0].second);
  CHECK(fs::exists(other + "/picture_montage.png"));
  CHECK_THAT(said[1].first, Catch::StartsWith("Export failed: " + refused + "/picture.json"));
  CHECK(said[1].second);
  CHECK(app.export_failures == 1);
  CHECK(test::slurp(refused + "/picture.json") == "the user's notes");
  said.clear();
  finish_exports(app, [&](const std::string& text, bool error) { said.emplace_back(text, error); });
  CHECK(said.empty());  // none waiting: returns at once
}

TEST_CASE("viewer browser lists the folder its path field shows", "[viewer]") {
  Fixture fx;
  fs::create_directory(fx.dir + "/out");
  App app;
  start_app(app, fx.image_path, fx.model_path);
  REQUIRE(run_until_idle(app));
  app.ui.export_folder = fx.dir + "/out";
  app.ui.browser.folder = "/";  // the browser was somewhere else before
  open_browser(app, BrowserPurpose::ExportFolder);
  CHECK(app.ui.browser.folder == fx.dir + "/out");
  CHECK(app.ui.browser.typed == fx.dir + "/out");
  // A default folder that does not exist yet: its nearest existing parent is listed.
  app.ui.export_folder = fx.dir + "/not-yet/exports";
  open_browser(app, BrowserPurpose::ExportFolder);
  CHECK(app.ui.browser.folder == fx.dir);
  CHECK(app.ui.browser.typed == fx.dir + "/not-yet/exports");
  app.ui.screenshot_path = fx.dir + "/out/shot.png";
  open_browser(app, BrowserPurpose::ScreenshotFile);
  CHECK(app.ui.browser.folder == fx.dir + "/out");
  CHECK(app.ui.browser.typed == fx.dir + "/out/shot.png");
  open_browser(app, BrowserPurpose::OpenImage);  // opening keeps the folder the browser was in
  CHECK(app.ui.browser.folder == fx.dir + "/out");
  CHECK(app.ui.browser.typed.empty());
}

TEST_CASE("viewer widget names: label, or window and section to tell equal labels apart", "[viewer]") {
  WidgetFrame frame;
  frame.widgets = {widget("Export", "Controls", {}, WidgetKind::Header, 1),
                   widget("Export", "Controls", {"Export"}, WidgetKind::Button, 2),
                   widget("none", "Controls", {"Mask"}, WidgetKind::Radio, 3),
                   widget("none", "Controls", {"Softmax scale"}, WidgetKind::Radio, 4),
                   widget("Export...", "##Menu_00", {"File"}, WidgetKind::MenuItem, 5),
                   widget("hidden", "Controls", {}, WidgetKind::Button, 6)};
  frame.widgets.back().visible = false;
  std::string error;
  CHECK(find_widget(frame, "Export...", error)->id == 5);
  CHECK(find_widget(frame, "File > Export...", error)->id == 5);
  CHECK(find_widget(frame, "Softmax scale > none", error)->id == 4);
  CHECK(find_widget(frame, "Controls > Mask > none", error)->id == 3);
  CHECK(find_widget(frame, "Export > Export", error)->id == 2);
  CHECK(find_widget(frame, "none", error) == nullptr);
  CHECK_THAT(error, Catch::Contains("names 2 widgets") && Catch::Contains("[Controls > Mask > none]"));
  CHECK(find_widget(frame, "Mask > Export", error) == nullptr);
  CHECK(find_widget(frame, "hidden", error) == nullptr);  // not on screen: not clickable
  CHECK_THAT(error, Catch::Contains("no visible widget 'hidden'"));
  const nlohmann::json j = widgets_json(frame);
  REQUIRE(j["widgets"].size() == 6);
  CHECK(j["widgets"][1]["path"] == "Controls > Export > Export");
  CHECK(j["widgets"][1]["kind"] == "button");
  CHECK(j["widgets"][1]["id"] == "0x00000002");
  CHECK(j["widgets"][1]["centre"][0] == 60.0);
}

TEST_CASE("viewer real-input script commands queue input steps, checks fail with the values", "[viewer]") {
  const auto commands = parse_script(
      "click Controls > Export and screenshot > Export\nclick image at 0.25 0.75\ndrag working size to 0\n"
      "key escape\ndrop /tmp/a b.png\nexpect show/heads true\nexpect-contains status grid 8x8\n"
      "click 1/sqrt(d)\n",
      "t");
  REQUIRE(commands.size() == 8);
  CHECK(commands[0].args == std::vector<std::string>{"Controls > Export and screenshot > Export"});
  CHECK(commands[1].args == std::vector<std::string>{"image", "0.25", "0.75"});
  CHECK(commands[2].args == std::vector<std::string>{"working size", "0"});
  CHECK(commands[4].args == std::vector<std::string>{"/tmp/a b.png"});
  CHECK(commands[6].args == std::vector<std::string>{"status", "grid 8x8"});
  CHECK_THROWS_WITH(parse_script("drag opacity\n", "t"), Catch::Contains("drag LABEL to T"));
  CHECK_THROWS_WITH(parse_script("click image at 2 0\n", "t"), Catch::Contains("click LABEL [at FX FY]"));
  CHECK_THROWS_WITH(parse_script("key space\n", "t"), Catch::Contains("key left|right"));

  Fixture fx;
  App app;
  start_app(app, fx.image_path, fx.model_path);
  REQUIRE(run_until_idle(app));
  app.ui.widgets.widgets = {widget("image", "Image", {}, WidgetKind::Picture, 1),
                            widget("working size", "Controls", {}, WidgetKind::Slider, 2)};
  CHECK(apply_script_command(app, commands[1]).empty());
  REQUIRE(app.input.size() == 3);  // move, press, release: one frame each
  CHECK(app.input[0].type == InputStep::Type::MouseMove);
  CHECK(app.input[0].x == 10.0f + 25.0f);
  CHECK(app.input[0].y == 20.0f + 15.0f);
  CHECK(app.input[1].type == InputStep::Type::MouseDown);
  CHECK(app.input[2].type == InputStep::Type::MouseUp);
  CHECK_FALSE(is_idle(app));  // the script waits until the window has played the input
  app.input.clear();
  CHECK(apply_script_command(app, commands[2]).empty());
  REQUIRE(app.input.size() == 5);
  CHECK(app.input[2].x == 10.0f);  // the left end of the track
  app.input.clear();
  CHECK(apply_script_command(app, commands[3]).empty());
  REQUIRE(app.input.size() == 2);  // a press and its release in the same frame
  CHECK(app.input[0].type == InputStep::Type::KeyDown);
  CHECK(app.input[1].type == InputStep::Type::KeyUp);
  CHECK(app.input[1].same_frame);
  app.input.clear();
  CHECK_THAT(apply_script_command(app, commands[0]), Catch::Contains("no visible widget"));
  CHECK(apply_script_command(app, commands[5]).empty());
  CHECK_THAT(apply_script_command(app, parse_script("expect show/heads false\n", "t")[0]),
             Catch::Contains("to be false, it is true"));
  CHECK(apply_script_command(app, commands[6]).empty());
  CHECK_THAT(apply_script_command(app, parse_script("expect-contains status grid 9x9\n", "t")[0]),
             Catch::Contains("without 'grid 9x9'"));
  CHECK_THAT(apply_script_command(app, parse_script("expect-file " + fx.dir + "/none.png\n", "t")[0]),
             Catch::Contains("it is not there"));
}

TEST_CASE("viewer script comments: a '#' word or line, never a '#' inside a widget ID", "[viewer]") {
  const auto commands = parse_script("# a comment\n  # indented\ndrag ##mass to 1  # top mass\nclick ...##export\n", "t");
  REQUIRE(commands.size() == 2);
  CHECK(commands[0].args == std::vector<std::string>{"##mass", "1"});
  CHECK(commands[1].args == std::vector<std::string>{"...##export"});
}

// [SECTION] Layers x heads grid, rollout mode, prefix-token queries

TEST_CASE("viewer layers x heads grid, prefix-token query and rollout mode are core's, and export as the CLI does",
          "[viewer][layer_grid]") {
  Fixture fx;
  App app;
  start_app(app, fx.image_path, fx.model_path);
  REQUIRE(run_until_idle(app));
  REQUIRE(app.doc.ready());
  const VitModel model = load_model(fx.model_path);  // depth 2, 4 heads, 8x8 patches + class token

  // The class token as the query: its maps are row 0 of the full softmax weights (keep_probs).
  REQUIRE(set_query_prefix(app, 0));
  CHECK_FALSE(set_query_prefix(app, 1));  // the model has one prefix token
  app.ui.view.layer = 0;
  app.ui.show_layers = true;
  REQUIRE(run_until_idle(app));
  CHECK(app.ui.view.mode == MapMode::Query);
  ForwardOptions options;
  options.keep_probs = true;
  const ForwardResult full = forward(model, app.doc.comp->image.grid, options);
  double worst = 0.0;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h)
      for (int p = 0; p < 64; ++p) {
        const float want = full.layers[static_cast<size_t>(l)].probs[static_cast<size_t>(h)](0, 1 + p);
        worst = std::max(worst, static_cast<double>(std::abs(app.derived.layers.maps[static_cast<size_t>(l)]
                                                                  .heads[static_cast<size_t>(h)].data()[p] - want)));
        if (l == 0) worst = std::max(worst, static_cast<double>(std::abs(app.derived.raw_maps.heads[static_cast<size_t>(h)].data()[p] - want)));
      }
  INFO("largest difference from the full weights " << worst);
  CHECK(worst <= 1e-6);
  CHECK(app.derived.layers.layers == 2);
  CHECK(app.derived.layers.picture.cols == 4 * 9 - 1);
  CHECK_THAT(cli_command(app, "out"), Catch::Contains("--token cls --layer 0"));

  // A click on a tile opens that layer and head.
  open_grid_cell(app, 1, 2);
  CHECK(current_layer(app) == 1);
  CHECK(app.ui.view.focus_head == 2);
  open_grid_cell(app, 5, 0);  // outside: nothing changes
  CHECK(current_layer(app) == 1);

  // Rollout from a query patch: the map is core's rollout row, and the export equals export_rollout.
  pin_query(app, 2, 5);
  set_rollout(app, true);
  app.ui.view.rollout_from_query = true;
  app.ui.compute.rollout.fusion = HeadFusion::Max;
  app.ui.compute.rollout.discard = 0.3f;
  REQUIRE(run_until_idle(app));
  REQUIRE(app.doc.comp->key.rollout.on);
  const int token = 1 + 2 * 8 + 5;
  CHECK(app.derived.rollout_query == token);
  RolloutOptions ro;
  ro.fusion = HeadFusion::Max;
  ro.discard_ratio = 0.3f;
  const MatRM reference = rollout_map(attention_rollout(full, ro), full, token);
  CHECK((app.derived.rollout_map - reference).cwiseAbs().maxCoeff() <= 1e-6f);
  CHECK(app.doc.comp->forward.layers[0].probs.empty());  // only the (N, N) rollout is kept
  const std::string command = cli_command(app, "out");
  CHECK_THAT(command, Catch::Contains("--rollout --patch 2,5 --fusion max --discard 0.3"));
  CHECK_THAT(command, !Catch::Contains("--layer"));
  const std::string viewer_dir = fx.dir + "/viewer-rollout", cli_dir = fx.dir + "/cli-rollout";
  fs::create_directory(viewer_dir);
  fs::create_directory(cli_dir);
  app.requests.export_folder = viewer_dir;
  REQUIRE(run_until_idle(app));
  CHECK_FALSE(app.ui.message.error);
  ExportSettings s;
  s.out_dir = cli_dir;
  s.select = QuerySelect::Patch;
  s.patch_row = 2;
  s.patch_col = 5;
  export_rollout(model, fx.image_path, s, ro);
  REQUIRE(fs::exists(viewer_dir + "/picture_rollout.png"));
  CHECK(read_text(viewer_dir + "/picture_rollout.png") == read_text(cli_dir + "/picture_rollout.png"));
  nlohmann::json a = nlohmann::json::parse(read_text(viewer_dir + "/picture_rollout.json"));
  nlohmann::json b = nlohmann::json::parse(read_text(cli_dir + "/picture_rollout.json"));
  for (nlohmann::json* j : {&a, &b}) {
    j->erase("timings_ms");
    j->erase("set");  // each export's commit id
    for (auto& f : (*j)["files"]) f = fs::path(f.get<std::string>()).filename().string();
  }
  CHECK(a == b);

  // A click on the grid from rollout mode opens the attention map (rollout off).
  open_grid_cell(app, 0, 3);
  CHECK_FALSE(app.ui.compute.rollout.on);
  CHECK(app.ui.view.focus_head == 3);
}

TEST_CASE("viewer predictions are the export's: the top classes of the pass on screen, in the state JSON",
          "[viewer][predictions]") {
  Fixture fx;
  const std::string image = std::string(VITLENS_TEST_FIXTURES) + "/foreign/image.png";
  const std::string model = std::string(VITLENS_TEST_FIXTURES) + "/foreign/hf_deit_cls/model.safetensors";
  App app;
  start_app(app, image, model);
  REQUIRE(run_until_idle(app));
  REQUIRE(app.doc.ready());
  const nlohmann::json state = state_json(app);
  ExportSettings settings;
  settings.max_side = app.doc.comp->key.max_side;
  const ImageAnalysis analysis = analyse_image(app.doc.model->model, image, settings);
  REQUIRE(analysis.predictions.has_classifier);
  REQUIRE(state.at("predictions").size() == analysis.predictions.top.size());
  for (size_t i = 0; i < analysis.predictions.top.size(); ++i) {
    CHECK(state["predictions"][i].at("index") == analysis.predictions.top[i].index);
    CHECK(state["predictions"][i].at("label") == analysis.predictions.labels[i]);
    CHECK(state["predictions"][i].at("probability").get<double>() == analysis.predictions.top[i].probability);
  }
  CHECK(state.at("classifier").at("names") == "config.json id2label");

  // A model without a head: an empty list and the one-line reason.
  App plain;
  start_app(plain, image, fx.model_path);
  REQUIRE(run_until_idle(plain));
  const nlohmann::json none = state_json(plain);
  CHECK(none.at("predictions").empty());
  CHECK_THAT(none.at("classifier").get<std::string>(), Catch::StartsWith("none: the model has no classifier head"));
}

// [SECTION] Preprocessing and precision

TEST_CASE("viewer preprocessing and precision switches give the CLI's picture and export", "[viewer][preprocess]") {
  Fixture fx;
  const std::string foreign = std::string(VITLENS_TEST_FIXTURES) + "/foreign";
  const std::string timm = foreign + "/timm_vit/model.safetensors";  // config.json beside it: pretrained_cfg
  App app;
  start_app(app, fx.wide_path, timm);  // 50x30: the crop shows
  REQUIRE(run_until_idle(app));
  REQUIRE(app.doc.ready());
  auto run = [&app](const std::string& verb, const std::string& arg) {
    ScriptCommand c;
    c.verb = verb;
    c.args = {arg};
    return apply_script_command(app, c);
  };
  auto has_line = [&app](const std::string& text) {
    for (const std::string& line : precision_lines(app))
      if (line.find(text) != std::string::npos) return true;
    return false;
  };

  // The defaults: the whole image, float32 (as `vitlens export`).
  CHECK(app.ui.compute.preprocess == Preprocess::Whole);
  CHECK(app.ui.compute.precision == Precision::Fp32);
  nlohmann::json state = state_json(app);
  CHECK(state["preprocess"] == "whole");
  CHECK(state["precision"] == "fp32");
  CHECK(state["transform"]["available"] == true);
  CHECK(preprocess_unavailable(app).empty());
  CHECK(preprocess_caption(app).empty());
  CHECK(precision_lines(app).empty());  // fp32 chosen and run: the switch says it all
  const int whole_rows = grid_rows(app), whole_cols = grid_cols(app);
  CHECK(whole_rows != whole_cols);  // 50x30 scaled to 16x10, padded to 16x12: 3x4 patches

  // The model's transform (timm: shortest edge to 16 / 0.9, centre crop 16x16) and bf16, from the script.
  REQUIRE(run("preprocess", "model").empty());
  REQUIRE(run("precision", "bf16").empty());
  REQUIRE(run_until_idle(app));
  const VitModel model = load_model(timm);
  const ImageTransform t = read_model_transform(timm, model.format);
  REQUIRE(t.present());
  // The picture is what the model sees: core's transform of the same file, byte for byte.
  const PreparedImage sees = prepare_image_transformed(load_image(fx.wide_path), model.config, t, fx.wide_path);
  cv::Mat sees8;
  sees.rgb.convertTo(sees8, CV_8UC3, 255.0);
  CHECK(same_bytes(app.derived.base_rgb8, sees8));
  CHECK(grid_rows(app) == 4);
  CHECK(grid_cols(app) == 4);
  CHECK(app.doc.comp->forward.precision == Precision::Bf16);
  CHECK(preprocess_caption(app) == t.library + ": " + t.describe());
  state = state_json(app);
  CHECK(state["preprocess"] == "model");
  CHECK(state["precision"] == "bf16");
  CHECK(state["precision_choice"] == "bf16");
  CHECK(state["transform"]["steps"] == t.describe());
  CHECK_FALSE(has_line("on screen"));  // the bf16 pass is the one on screen
  // This machine's bfloat16 products run on float32 FMAs (AVX2) or are emulated (portable kernels)
  // unless it has AVX512-BF16 and runs those kernels.
  CHECK(has_line("bf16 runs on float32 FMAs here") == (bf16_kernel() == Bf16Kernel::Avx2));
  CHECK(has_line("bf16 is emulated here") == (bf16_kernel() == Bf16Kernel::Emulated));
  const std::string command = cli_command(app, "out");
  CHECK_THAT(command, Catch::Contains("--preprocess model --precision bf16"));
  CHECK_THAT(command, !Catch::Contains("--size"));
  CHECK(cli_equivalent(app));

  // Pictures and export: core's for the same settings, as `vitlens export --preprocess model --precision bf16`.
  ExportSettings s;
  s.select = QuerySelect::Patch;
  s.patch_row = app.ui.view.query_row;
  s.patch_col = app.ui.view.query_col;
  s.transform = t;
  s.precision = Precision::Bf16;
  const ImageAnalysis reference = analyse_image(model, fx.wide_path, s);
  const ExportImages expected = render_export_images(model, reference, s.style, s.normalize);
  CHECK(same_bytes(app.derived.pictures.montage, expected.montage));
  bool names_transform = false, names_bf16 = false;
  for (const std::string& phrase : montage_caption(model, app.derived.view, s.normalize)) {
    names_transform = names_transform || phrase.find("preprocess: the model's own") != std::string::npos;
    names_bf16 = names_bf16 || phrase.find("bf16") != std::string::npos;
  }
  CHECK(names_transform);
  CHECK(names_bf16);
  const std::string viewer_dir = fx.dir + "/viewer-model", cli_dir = fx.dir + "/cli-model";
  fs::create_directory(viewer_dir);
  fs::create_directory(cli_dir);
  app.requests.export_folder = viewer_dir;
  REQUIRE(run_until_idle(app));
  CHECK_FALSE(app.ui.message.error);
  s.out_dir = cli_dir;
  export_attention(model, fx.wide_path, s);
  for (const char* name : {"wide_head0.png", "wide_mean.png", "wide_montage.png"}) {
    INFO(name);
    REQUIRE(fs::exists(viewer_dir + "/" + name));
    CHECK(read_text(viewer_dir + "/" + name) == read_text(cli_dir + "/" + name));
  }
  auto record = [](const std::string& path) {
    nlohmann::json j = nlohmann::json::parse(read_text(path));
    j.erase("timings_ms");
    j.erase("set");
    for (auto& f : j["files"]) f = fs::path(f.get<std::string>()).filename().string();
    return j;
  };
  const nlohmann::json exported = record(viewer_dir + "/wide.json");
  CHECK(exported == record(cli_dir + "/wide.json"));
  CHECK(exported["preprocess"] == "model");
  CHECK(exported["precision"] == "bf16");
  CHECK(exported["transform"]["steps"] == t.describe());

  // auto is core's rule: this tiny model stays float32 on any CPU, and the line says why. The pass
  // is the fp32 one, so choosing auto after fp32 computes nothing new.
  REQUIRE(run("precision", "auto").empty());
  REQUIRE(run_until_idle(app));
  CHECK(app.doc.comp->forward.precision == resolve_precision(Precision::Auto, model));
  CHECK(app.doc.comp->forward.precision == Precision::Fp32);
  CHECK(has_line("auto chose fp32"));
  CHECK(has_line("below 20.0 M"));
  CHECK_FALSE(has_line("emulated"));  // nothing runs in bf16
  CHECK_THAT(cli_command(app, "out"), !Catch::Contains("--precision"));

  // Back to the whole image: the working size's grid again.
  REQUIRE(run("preprocess", "whole").empty());
  REQUIRE(run_until_idle(app));
  CHECK(grid_rows(app) == whole_rows);
  CHECK(grid_cols(app) == whole_cols);

  // A model without a transform: the switch is refused with the reason, and a model choice
  // falls back to the whole image.
  REQUIRE(run("preprocess", "model").empty());
  app.requests.open_model = foreign + "/hf_vit/model.safetensors";  // no preprocessor_config.json
  REQUIRE(run_until_idle(app));
  REQUIRE(app.doc.ready());
  CHECK(app.doc.comp->key.preprocess == Preprocess::Whole);
  CHECK(preprocess_caption(app).empty());
  const std::string why = preprocess_unavailable(app);
  CHECK_THAT(why, Catch::Contains("publishes no transform") && Catch::Contains("preprocessor_config.json"));
  CHECK(run("preprocess", "model") == why);
  state = state_json(app);
  CHECK(state["transform"]["available"] == false);
  CHECK(state["transform"]["why_not"] == why);
  CHECK(state["preprocess"] == "whole");
  CHECK_THAT(cli_command(app, "out"), !Catch::Contains("--preprocess"));
  // Script words are checked before any window opens.
  CHECK_THROWS_WITH(parse_script("preprocess crop\n", "t"), Catch::Contains("preprocess whole|model"));
  CHECK_THROWS_WITH(parse_script("precision fp16\n", "t"), Catch::Contains("precision fp32|bf16|auto"));
}

TEST_CASE("viewer remembers the precision choice between runs", "[viewer]") {
  Fixture fx;
  const std::string path = fx.dir + "/settings.json";
  Settings settings;
  settings.precision = "auto";
  save_settings(path, settings);
  App app;
  app.settings_file = path;
  CHECK(load_app_settings(app).empty());
  CHECK(app.ui.compute.precision == Precision::Auto);
  set_precision(app, Precision::Bf16);
  save_app_settings(app, 0, 0);
  CHECK(load_settings(path, nullptr).precision == "bf16");
  // A name vitlens does not know keeps the default.
  settings.precision = "fp16";
  save_settings(path, settings);
  App other;
  other.settings_file = path;
  load_app_settings(other);
  CHECK(other.ui.compute.precision == kViewerDefaultPrecision);
}

TEST_CASE("viewer settings it cannot read are left as they are, the warning stays in the status bar", "[viewer]") {
  Fixture fx;
  const std::string path = fx.dir + "/settings.json";
  const std::string typo = "{\"colormap\": \"magma\", \"alpha\": 0.3,}\n";  // a hand edit with a trailing comma
  test::spit(path, typo);
  App app;
  app.settings_file = path;
  const std::string warning = load_app_settings(app);
  CHECK(warning == path + ": settings are not a JSON object; using the defaults (the file is left as it is: mend or "
                          "remove it to have settings saved again)");
  start_app(app, fx.image_path, fx.model_path);
  REQUIRE(run_until_idle(app));
  REQUIRE(app.doc.ready());
  // The first "Opened ..." does not replace it (the status bar shows what is open beside it).
  CHECK(app.ui.message.text == warning);
  CHECK(app.ui.message.error);
  app.ui.display.style.colormap = "inferno";
  save_app_settings(app, 800, 600);
  CHECK(test::slurp(path) == typo);
  // A link whose target does not exist yet (dotfiles kept elsewhere) counts as missing: no
  // warning, and the settings are written through it.
  const std::string link = fx.dir + "/linked-settings.json", target = fx.dir + "/dotfiles/settings.json";
  REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
  App linked;
  linked.settings_file = link;
  CHECK(load_app_settings(linked).empty());
  save_app_settings(linked, 800, 600);
  CHECK(load_settings(target, nullptr).window_w == 800);
  // Once mended, the next session saves as before.
  test::spit(path, "{\"colormap\": \"magma\"}\n");
  App mended;
  mended.settings_file = path;
  CHECK(load_app_settings(mended).empty());
  CHECK(mended.ui.display.style.colormap == "magma");
  mended.ui.display.style.colormap = "inferno";
  save_app_settings(mended, 800, 600);
  CHECK(load_settings(path, nullptr).colormap == "inferno");
}

TEST_CASE("viewer export command quotes names for the shell: a quote or $(...) stays text", "[viewer]") {
  Fixture fx;
  const std::string image = fx.dir + "/a'$(touch PWNED)'.png", out = fx.dir + "/it's `out`";
  fs::copy_file(fx.image_path, image);
  App app;
  start_app(app, image, fx.model_path);
  REQUIRE(run_until_idle(app));
  REQUIRE(app.doc.ready());
  const std::string command = cli_command(app, out);
  CHECK_THAT(command, Catch::StartsWith("vitlens export '" + fx.dir + "/a'\\''$(touch PWNED)'\\''.png' --model '"));
  CHECK_THAT(command, Catch::EndsWith(" --out '" + fx.dir + "/it'\\''s `out`'"));
  app.ui.export_folder = out;
  CHECK(state_json(app)["cli_command"] == command);
  // Pasted into a shell (a function named vitlens prints its arguments, NUL-separated): the same
  // words come back, and nothing in a name runs.
  const std::string script = "cd '" + fx.dir + "' && vitlens() { printf '%s\\0' \"$@\"; } && " + command;
  FILE* shell = ::popen(script.c_str(), "r");
  REQUIRE(shell != nullptr);
  std::string printed;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, shell)) > 0;) printed.append(buf, n);
  CHECK(::pclose(shell) == 0);
  std::vector<std::string> words;
  for (size_t at = 0, end; (end = printed.find('\0', at)) != std::string::npos; at = end + 1)
    words.push_back(printed.substr(at, end - at));
  REQUIRE(words.size() >= 6);
  CHECK(words[0] == "export");
  CHECK(words[1] == image);
  CHECK(words[2] == "--model");
  CHECK(words[3] == fx.model_path);
  CHECK(words[words.size() - 2] == "--out");
  CHECK(words.back() == out);
  CHECK_FALSE(fs::exists(fx.dir + "/PWNED"));
}
