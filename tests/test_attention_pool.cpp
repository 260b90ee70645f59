// The attention pool (SigLIP's head) as a query of its own, against the libraries' own pool:
//  - the pool's maps (MapMode::Pool) are its weights over the patch tokens that timm and
//    transformers computed for the fixtures (pool_probs.npy, tests/fixtures/make_foreign_fixtures.py),
//    to the fixtures' tolerance, 1e-5;
//  - the layers x heads grid gets the pool's row after the blocks' rows (the same maps), and is
//    that row alone in pool mode;
//  - padding and painted patches are keys the pool never reads, as in the blocks;
//  - `vitlens export --pool` writes the pool's maps and records them in the JSON and the caption;
//    every combination that cannot apply is one line.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "npy_support.hpp"
#include "process_support.hpp"
#include "test_support.hpp"
#include "core/base/error.hpp"
#include "core/io/image.hpp"
#include "core/render/export.hpp"
#include "core/render/layer_grid.hpp"
#include "models/model_io.hpp"

using namespace vitlens;

namespace {

const std::string kForeign = std::string(VITLENS_TEST_FIXTURES) + "/foreign/";
const char* const kPoolCases[] = {"timm_siglip_map", "timm_siglip1_map", "timm_reg_map", "hf_siglip"};

struct PoolCase {
  VitModel model;
  ForwardResult result;
  NpyArray pool;  // (H, Np) the library's pool weights
};

PoolCase load_pool_case(const std::string& name, const ForwardOptions& options = {}) {
  PoolCase c;
  c.model = load_model(kForeign + name + "/model.safetensors");
  const PreparedImage image = prepare_image(load_image_rgb(kForeign + "image.png"), c.model.config, 0);
  c.result = forward(c.model, image.grid, options);
  c.pool = read_npy(kForeign + name + "/pool_probs.npy");
  return c;
}

// Largest |map - library| over the pool's heads and the patches.
double worst_against_pool(const PoolCase& c, const HeadMaps& maps) {
  double worst = 0.0;
  const int patches = c.result.grid_h * c.result.grid_w;
  for (size_t h = 0; h < maps.heads.size(); ++h)
    for (int p = 0; p < patches; ++p)
      worst = std::max(worst, static_cast<double>(std::abs(maps.heads[h](p / c.result.grid_w, p % c.result.grid_w) -
                                                           c.pool.values[h * static_cast<size_t>(patches) + static_cast<size_t>(p)])));
  return worst;
}

}  // namespace

TEST_CASE("the attention pool's maps are the library's pool weights", "[pool][parity]") {
  for (const char* name : kPoolCases) {
    INFO(name);
    const PoolCase c = load_pool_case(name);
    MapRequest request;
    request.mode = MapMode::Pool;
    request.layer = c.model.config.depth - 1;
    const HeadMaps maps = attention_maps(c.model, c.result, request);
    REQUIRE(maps.heads.size() == static_cast<size_t>(c.model.config.num_heads));
    CHECK(worst_against_pool(c, maps) <= 1e-5);
    for (int h = 0; h < c.model.config.num_heads; ++h) {
      CHECK(maps.heads[static_cast<size_t>(h)].sum() == Approx(1.0).epsilon(1e-5));  // every weight on a patch
      CHECK(maps.prefix_weight.row(h).sum() == 0.0f);  // registers are not the pool's keys
    }
    // The pool reads the last layer's output: any layer of the request gives the same maps.
    request.layer = 0;
    CHECK(attention_maps(c.model, c.result, request).heads[0] == maps.heads[0]);
  }
  // A model without a pool: one line naming what it lacks.
  const VitModel vit = load_model(kForeign + "timm_vit/model.safetensors");
  const ForwardResult f = forward(vit, prepare_image(load_image_rgb(kForeign + "image.png"), vit.config, 0).grid, {});
  CHECK(f.pool_probs.size() == 0);
  MapRequest pool;
  pool.mode = MapMode::Pool;
  CHECK_THROWS_WITH(attention_maps(vit, f, pool), Catch::Contains("has no attention pool"));
}

TEST_CASE("the layers x heads grid has the pool's row after the blocks", "[pool][grid]") {
  const PoolCase c = load_pool_case("timm_reg_map");
  const int L = c.model.config.depth, H = c.model.config.num_heads;
  LayerGridStyle style;
  style.cell_gap = 1;
  const LayerGrid g = layer_grid(c.model, c.result, MapMode::Received, 0, style);
  CHECK(g.layers == L);
  CHECK(g.pool_row);
  REQUIRE(g.rows() == L + 1);
  REQUIRE(g.maps.size() == static_cast<size_t>(L + 1));
  CHECK(g.picture.rows == (L + 1) * (g.grid_h + 1) - 1);
  CHECK(worst_against_pool(c, g.maps.back()) <= 1e-5);
  int layer = -1, head = -1;
  REQUIRE(layer_grid_cell(g, 1, 2 * (g.grid_w + 1) + 1, L * (g.grid_h + 1) + 1, layer, head));
  CHECK(layer == L);  // the pool's row
  CHECK(head == 2);
  CHECK_FALSE(layer_grid_cell(g, 1, 0, (L + 1) * (g.grid_h + 1) + 1, layer, head));  // below it: nothing

  // In pool mode the grid is the pool's row alone.
  const LayerGrid only = layer_grid(c.model, c.result, MapMode::Pool, 0, style);
  CHECK(only.layers == 0);
  REQUIRE(only.rows() == 1);
  CHECK(only.picture.rows == only.grid_h);
  CHECK(only.picture.cols == H * (only.grid_w + 1) - 1);
  CHECK(worst_against_pool(c, only.maps[0]) <= 1e-5);
  CHECK_THROWS_WITH(all_layer_maps(c.model, c.result, MapMode::Pool, 0), Catch::Contains("one row after the blocks"));

  // A model without a pool: no extra row; pool mode is refused in one line.
  const VitModel vit = load_model(kForeign + "timm_vit/model.safetensors");
  const ForwardResult f = forward(vit, prepare_image(load_image_rgb(kForeign + "image.png"), vit.config, 0).grid, {});
  const LayerGrid plain = layer_grid(vit, f, MapMode::Received, 0, style);
  CHECK_FALSE(plain.pool_row);
  CHECK(plain.rows() == plain.layers);
  CHECK_THROWS_WITH(layer_grid(vit, f, MapMode::Pool, 0, style), Catch::Contains("has no attention pool"));
}

TEST_CASE("the attention pool never reads a masked patch", "[pool]") {
  ForwardOptions options;
  options.forbidden_patches.assign(16, 0);
  for (int p : {0, 5, 6, 15}) options.forbidden_patches[static_cast<size_t>(p)] = 1;
  const PoolCase masked = load_pool_case("hf_siglip", options);
  const PoolCase plain = load_pool_case("hf_siglip");
  const int H = masked.model.config.num_heads;
  for (int h = 0; h < H; ++h) {
    for (int p : {0, 5, 6, 15}) CHECK(masked.result.pool_probs(h, p) == 0.0f);
    CHECK(masked.result.pool_probs.row(h).sum() == Approx(1.0).epsilon(1e-5));
    // The allowed keys keep their ratios: the masked softmax is the plain one renormalised, but
    // the tokens themselves changed (the blocks masked the same keys), so only the zeros and the
    // sum are certain; the pooled vector moves.
  }
  CHECK(max_abs_diff(masked.result.pooled.data(), plain.result.pooled.data(), static_cast<size_t>(plain.result.pooled.size())) > 1e-4);
  // Every key masked: a zero row and a finite pooled vector (proj's and the MLP's biases), as the blocks' zero rows.
  options.forbidden_patches.assign(16, 1);
  const PoolCase none = load_pool_case("hf_siglip", options);
  CHECK(none.result.pool_probs.isZero());
  CHECK(none.result.pooled.allFinite());
}

TEST_CASE("cli: export --pool writes the pool's maps and says so", "[pool][cli]") {
  const std::string dir = test::temp_dir("cli-pool");
  const std::string model = kForeign + "timm_siglip_map/model.safetensors";
  const std::string base = "export " + kForeign + "image.png --model " + model + " --out " + dir + " --size 0 ";
  const test::ShellRun ok = test::run_vitlens_shell(dir, base + "--pool");
  REQUIRE(ok.code == 0);
  const nlohmann::json j = nlohmann::json::parse(test::slurp(dir + "/image.json"));
  CHECK(j["mode"] == "pool");
  CHECK(j["query"]["name"] == "attention pool");
  CHECK(j["query"]["after_layer"] == 1);
  CHECK(j["layer"] == 1);
  const NpyArray pool = read_npy(kForeign + "timm_siglip_map/pool_probs.npy");
  for (size_t h = 0; h < 3; ++h) {
    CHECK(j["heads"][h]["max"].get<double>() ==
          Approx(*std::max_element(pool.values.begin() + static_cast<long>(h * 16), pool.values.begin() + static_cast<long>(h * 16 + 16))).margin(1e-5));
    CHECK(j["heads"][h]["sum"].get<double>() == Approx(1.0).epsilon(1e-5));
  }
  // The caption names the pool (analyse_image + montage_caption, as the montage draws it).
  ExportSettings s;
  s.select = QuerySelect::Pool;
  s.max_side = 0;
  const VitModel m = load_model(model);
  const ImageAnalysis a = analyse_image(m, kForeign + "image.png", s);
  bool said = false;
  for (const std::string& phrase : montage_caption(m, a, s.normalize))
    said |= phrase.find("attention pool") != std::string::npos;
  CHECK(said);

  // --raw also writes the pool's weights, (heads, tokens), the library's to the fixtures' tolerance,
  // listed in the record with the other files.
  const test::ShellRun raw = test::run_vitlens_shell(dir, base + "--raw");
  REQUIRE(raw.code == 0);
  const NpyArray written = read_npy(dir + "/image_pool_attn.npy");
  REQUIRE(written.shape == std::vector<int64_t>{3, 16});
  for (size_t i = 0; i < written.values.size(); ++i) CHECK(written.values[i] == Approx(pool.values[i]).margin(1e-5));
  bool listed = false;
  const nlohmann::json record = nlohmann::json::parse(test::slurp(dir + "/image.json"));
  for (const auto& file : record["files"]) listed |= file.get<std::string>().find("image_pool_attn.npy") != std::string::npos;
  CHECK(listed);
  const std::string plain = test::temp_dir("cli-pool-none");
  REQUIRE(test::run_vitlens_shell(plain, "export " + kForeign + "image.png --model " + kForeign +
                                             "timm_vit/model.safetensors --size 0 --raw --out " + plain).code == 0);
  CHECK(std::filesystem::exists(plain + "/image_attn.npy"));
  CHECK_FALSE(std::filesystem::exists(plain + "/image_pool_attn.npy"));

  // What cannot apply: one line each, before any file is written.
  struct Refused { std::string args; const char* says; };
  const Refused refused[] = {
      {"export " + kForeign + "image.png --model " + kForeign + "timm_vit/model.safetensors --out " + dir + " --pool",
       "has no attention pool"},
      {base + "--pool --rollout", "--rollout"},
      {base + "--pool --layer all", "--layer all"},
      {base + "--pool --layer 0", "does not apply"},
      {base + "--pool --cls", "excludes"},
  };
  for (const Refused& r : refused) {
    INFO(r.args);
    const test::ShellRun run = test::run_vitlens_shell(dir, r.args);
    CHECK(run.code != 0);
    CHECK(std::count(run.err.begin(), run.err.end(), '\n') == 1);
    CHECK_THAT(run.err, Catch::Contains(r.says));
  }
}
