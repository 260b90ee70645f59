// The layers x heads grid and prefix tokens as queries, against independent references:
//  - every tile of the grid, for a patch query and for each prefix token (class, distillation,
//    registers), equals the library's own attention weights (probs.npy that timm wrote for the
//    fixture, tests/fixtures/make_foreign_fixtures.py) to the fixtures' tolerance, 1e-5;
//  - the grid's picture is the colour map of exactly those maps, scaled as the heads view scales
//    one layer (map_scales, display_values), with the threshold of apply_threshold;
//  - `--token` names resolve to the right rows, and every name a model cannot take is one line.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "npy_support.hpp"
#include "test_support.hpp"
#include "core/base/error.hpp"
#include "core/render/export.hpp"
#include "core/render/heatmap.hpp"
#include "core/io/image.hpp"
#include "core/render/layer_grid.hpp"
#include "models/model_io.hpp"

using namespace vitlens;

namespace {

const std::string kForeign = std::string(VITLENS_TEST_FIXTURES) + "/foreign/";

struct ForeignCase {
  VitModel model;
  ForwardResult result;
  NpyArray probs;  // (L, H, N, N) from the library's forward
};

ForeignCase load_case(const std::string& name) {
  ForeignCase c;
  c.model = load_model(kForeign + name + "/model.safetensors");
  const PreparedImage image = prepare_image(load_image_rgb(kForeign + "image.png"), c.model.config, 0);
  c.result = forward(c.model, image.grid, ForwardOptions{});  // no (N, N) weights kept: maps come from q and K
  c.probs = read_npy(kForeign + name + "/probs.npy");
  return c;
}

// The library's weight of query `q` on patch (r, col), layer l, head h.
float library_weight(const ForeignCase& c, int l, int h, int q, int r, int col) {
  const int64_t heads = c.probs.shape[1], n = c.probs.shape[2];
  const int64_t key = c.result.prefix + r * c.result.grid_w + col;
  return c.probs.values[static_cast<size_t>(((static_cast<int64_t>(l) * heads + h) * n + q) * n + key)];
}

// Largest |grid tile - library| over every layer, head and patch for query token q.
double worst_against_library(const ForeignCase& c, const std::vector<HeadMaps>& maps, int q) {
  double worst = 0.0;
  for (size_t l = 0; l < maps.size(); ++l)
    for (size_t h = 0; h < maps[l].heads.size(); ++h)
      for (int r = 0; r < c.result.grid_h; ++r)
        for (int col = 0; col < c.result.grid_w; ++col)
          worst = std::max(worst, static_cast<double>(std::abs(
                                      maps[l].heads[h](r, col) -
                                      library_weight(c, static_cast<int>(l), static_cast<int>(h), q, r, col))));
  return worst;
}

}  // namespace

TEST_CASE("Every tile of the layers x heads grid is the library's attention row, prefix tokens included",
          "[layer_grid][formats]") {
  // DINOv2 with 4 registers (1 class + 4 registers + 16 patches) and distilled DeiT (class +
  // distillation + 16 patches): every prefix token the models have, and two patches.
  for (const std::string name : {"timm_dinov2_reg", "timm_deit_distilled", "hf_dinov2_reg"}) {
    SECTION(name) {
      const ForeignCase c = load_case(name);
      const VitConfig& cfg = c.model.config;
      REQUIRE(c.probs.shape == std::vector<int64_t>{cfg.depth, cfg.num_heads, c.result.tokens, c.result.tokens});
      std::vector<std::string> names = {"cls"};
      if (cfg.dist_token) names.push_back("dist");
      for (int k = 0; k < cfg.register_tokens; ++k) names.push_back("reg" + std::to_string(k));
      REQUIRE(static_cast<int>(names.size()) == cfg.prefix_tokens());
      REQUIRE(cfg.prefix_tokens() >= 2);
      for (const std::string& token : names) {
        const int q = prefix_token_index(cfg, token);
        INFO(name << " --token " << token << " = token " << q);
        CHECK(prefix_token_short_name(cfg, q) == token);
        const std::vector<HeadMaps> maps = all_layer_maps(c.model, c.result, MapMode::Query, q);
        REQUIRE(static_cast<int>(maps.size()) == cfg.depth);
        const double worst = worst_against_library(c, maps, q);
        INFO("largest difference " << worst);
        CHECK(worst <= 1e-5);
        // The prefix weights of the row too (the part the patch maps leave out).
        for (int h = 0; h < cfg.num_heads; ++h)
          for (int t = 0; t < c.result.prefix; ++t) {
            const int64_t n = c.result.tokens;
            const float want = c.probs.values[static_cast<size_t>((((cfg.depth - 1) * cfg.num_heads + h) * n + q) * n + t)];
            CHECK(std::abs(maps.back().prefix_weight(h, t) - want) <= 1e-5f);
          }
      }
      for (int patch : {0, c.result.grid_h * c.result.grid_w - 1}) {
        const int q = c.result.prefix + patch;
        CHECK(worst_against_library(c, all_layer_maps(c.model, c.result, MapMode::Query, q), q) <= 1e-5);
      }
      // The class token's stored row (cls mode) is the same row as the class token as a query.
      CHECK(worst_against_library(c, all_layer_maps(c.model, c.result, MapMode::ClassToken, 0), 0) <= 1e-5);
    }
  }
}

TEST_CASE("The grid picture is each layer's maps coloured as the heads view scales them", "[layer_grid]") {
  const ForeignCase c = load_case("timm_dinov2_reg");
  const int L = c.model.config.depth, H = c.model.config.num_heads, gh = c.result.grid_h, gw = c.result.grid_w;
  for (const Normalize normalize : {Normalize::Robust, Normalize::Shared, Normalize::Log}) {
    for (const float threshold : {0.0f, 0.6f}) {
      INFO("normalize " << normalize_name(normalize) << ", threshold " << threshold);
      LayerGridStyle style;
      style.colormap = "inferno";
      style.normalize = normalize;
      style.threshold = threshold;
      style.cell_gap = 2;
      const int q = prefix_token_index(c.model.config, "reg1");
      const LayerGrid g = layer_grid(c.model, c.result, MapMode::Query, q, style);
      REQUIRE(g.layers == L);
      REQUIRE(g.heads == H);
      REQUIRE(g.picture.type() == CV_8UC3);
      REQUIRE(g.picture.rows == L * (gh + 2) - 2);
      REQUIRE(g.picture.cols == H * (gw + 2) - 2);
      int mismatched = 0;
      for (int l = 0; l < L; ++l) {
        // The reference: this layer's maps from attention_maps, thresholded and scaled on their own.
        MapRequest request;
        request.mode = MapMode::Query;
        request.layer = l;
        request.query_token = q;
        HeadMaps maps = attention_maps(c.model, c.result, request);
        if (threshold > 0.0f) apply_threshold(maps, threshold);  // the scale then counts the kept patches
        const std::vector<float> scales = map_scales(maps, normalize);
        for (int h = 0; h < H; ++h) {
          const MatRM shown = display_values(maps.heads[static_cast<size_t>(h)], scales[static_cast<size_t>(h)], normalize);
          cv::Mat unit(gh, gw, CV_32F);
          for (int r = 0; r < gh; ++r)
            for (int col = 0; col < gw; ++col) unit.at<float>(r, col) = shown(r, col);
          const cv::Mat want = apply_colormap(unit, "inferno");
          const cv::Mat tile = g.picture(cv::Rect(h * (gw + 2), l * (gh + 2), gw, gh));
          mismatched += cv::norm(tile, want, cv::NORM_INF) > 0 ? 1 : 0;
        }
      }
      CHECK(mismatched == 0);
      // Gaps are the background, never a colour of the map.
      CHECK(g.picture.at<cv::Vec3b>(gh, 0) == cv::Vec3b(24, 24, 26));
      CHECK(g.picture.at<cv::Vec3b>(0, gw + 1) == cv::Vec3b(24, 24, 26));
    }
  }
}

TEST_CASE("A pixel of the grid picture names its tile, gaps and the outside name none", "[layer_grid]") {
  LayerGrid g;
  g.layers = 12, g.heads = 12, g.grid_h = 14, g.grid_w = 14;
  int layer = -1, head = -1;
  for (int l = 0; l < 12; ++l)
    for (int h = 0; h < 12; ++h) {
      REQUIRE(layer_grid_cell(g, 1, h * 15 + 7, l * 15 + 13, layer, head));
      CHECK(layer == l);
      CHECK(head == h);
    }
  CHECK_FALSE(layer_grid_cell(g, 1, 14, 3, layer, head));        // the gap after head 0
  CHECK_FALSE(layer_grid_cell(g, 1, 3, 14, layer, head));        // the gap after layer 0
  CHECK_FALSE(layer_grid_cell(g, 1, 12 * 15, 3, layer, head));   // right of the last head
  CHECK_FALSE(layer_grid_cell(g, 1, -1, 3, layer, head));
}

TEST_CASE("Prefix token names (--token): what each model has, and one line for what it does not", "[layer_grid][cli]") {
  VitConfig plain = test::small_config();
  CHECK(prefix_token_index(plain, "cls") == 0);
  auto message = [](const VitConfig& config, const std::string& name) {
    try {
      prefix_token_index(config, name);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(message(plain, "dist"), Catch::Contains("--token dist") && Catch::Contains("no distillation token"));
  CHECK_THAT(message(plain, "reg0"), Catch::Contains("no register tokens"));
  CHECK_THAT(message(plain, "patch"), Catch::Contains("expects cls, dist or regK"));
  CHECK_THAT(message(plain, "reg"), Catch::Contains("expects cls, dist or regK"));
  CHECK_THAT(message(plain, "reg-1"), Catch::Contains("expects cls, dist or regK"));
  CHECK_THAT(message(plain, "reg99999999999"), Catch::Contains("expects cls, dist or regK"));
  VitConfig none = test::small_config(16, false);
  CHECK_THAT(message(none, "cls"), Catch::Contains("no class token"));
  VitConfig all = test::small_config();
  all.dist_token = true;
  all.register_tokens = 4;
  CHECK(prefix_token_index(all, "dist") == 1);
  CHECK(prefix_token_index(all, "reg0") == 2);
  CHECK(prefix_token_index(all, "reg3") == 5);
  CHECK_THAT(message(all, "reg4"), Catch::Contains("has 4 register tokens, reg0 to reg3"));
  for (const std::string& m : {message(plain, "dist"), message(all, "reg4"), message(none, "cls")})
    CHECK(m.find('\n') == std::string::npos);
}

TEST_CASE("An export with a prefix token as the query writes that token's row and names it", "[layer_grid][export]") {
  const std::string dir = test::temp_dir("token-export");
  const VitModel model = load_model(kForeign + "timm_dinov2_reg/model.safetensors");
  const NpyArray probs = read_npy(kForeign + "timm_dinov2_reg/probs.npy");
  ExportSettings s;
  s.out_dir = dir;
  s.select = QuerySelect::Token;
  s.token = "reg2";
  s.layer = 0;
  s.max_side = 0;
  const ImageAnalysis a = analyse_image(model, kForeign + "image.png", s);
  const int q = model.config.first_register() + 2;
  CHECK(a.request.mode == MapMode::Query);
  CHECK(a.request.query_token == q);
  const int64_t n = a.forward.tokens;
  double worst = 0.0;
  for (int h = 0; h < model.config.num_heads; ++h)
    for (int p = 0; p < a.forward.grid_h * a.forward.grid_w; ++p)
      worst = std::max(worst, static_cast<double>(std::abs(
                                  a.maps.heads[static_cast<size_t>(h)].data()[p] -
                                  probs.values[static_cast<size_t>(((0 * model.config.num_heads + h) * n + q) * n + a.forward.prefix + p)])));
  INFO("largest difference " << worst);
  CHECK(worst <= 1e-5);
  write_export(model, a, s);
  const nlohmann::json j = nlohmann::json::parse(npy_file_bytes(dir + "/image.json"));
  CHECK(j["query"]["token"] == q);
  CHECK(j["query"]["name"] == "register 2");
  CHECK(j["query"]["prefix"] == "reg2");
  CHECK(j["mode"] == "query");
}
