// Attention rollout against the numpy reference in tests/fixtures/make_foreign_fixtures.py
// (vit-explain's algorithm with rows renormalised by their own sums), on the attention weights
// the real libraries computed for three fixtures (class token; class token + 4 registers; CLIP),
// for mean / max / min head fusion and discard ratios 0, 0.5, 0.9. Tolerance 1e-5.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "npy_support.hpp"
#include "core/base/error.hpp"
#include "models/model_io.hpp"
#include "core/render/export_layers.hpp"
#include "core/model/rollout.hpp"

namespace {

const std::string kForeignDir = std::string(VITLENS_TEST_FIXTURES) + "/foreign/";

// A forward result holding the library's (L, H, N, N) weights, as keep_probs leaves them.
vitlens::ForwardResult result_from_probs(const NpyArray& probs, int prefix, bool has_class_token, int grid) {
  const int L = static_cast<int>(probs.shape[0]), H = static_cast<int>(probs.shape[1]), N = static_cast<int>(probs.shape[2]);
  vitlens::ForwardResult r;
  r.tokens = N;
  r.prefix = prefix;
  r.has_class_token = has_class_token;
  r.grid_h = r.grid_w = grid;
  r.layers.resize(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h)
      r.layers[static_cast<size_t>(l)].probs.push_back(
          vitlens::ConstMapRM(probs.values.data() + (static_cast<size_t>(l) * H + h) * N * N, N, N));
  return r;
}

}  // namespace

TEST_CASE("attention rollout matches the numpy reference", "[rollout]") {
  const nlohmann::json manifest = nlohmann::json::parse(npy_file_bytes(kForeignDir + "manifest.json"));
  int checked = 0;
  for (const auto& c : manifest.at("cases")) {
    if (!c.contains("rollouts") || c["rollouts"].empty()) continue;
    const std::string name = c.at("name").get<std::string>();
    const vitlens::VitModel model = vitlens::load_model(kForeignDir + c.at("model").get<std::string>());
    const NpyArray probs = read_npy(kForeignDir + c.at("probs").get<std::string>());
    const vitlens::ForwardResult r =
        result_from_probs(probs, model.config.prefix_tokens(), model.config.class_token, model.config.grid_h());
    for (const auto& ro : c["rollouts"]) {
      const std::string fusion = ro.at("fusion").get<std::string>();
      const double ratio = ro.at("discard_ratio").get<double>();
      INFO(name << " " << fusion << " discard " << ratio);
      vitlens::RolloutOptions options;
      options.fusion = fusion == "max" ? vitlens::HeadFusion::Max : fusion == "min" ? vitlens::HeadFusion::Min : vitlens::HeadFusion::Mean;
      options.discard_ratio = static_cast<float>(ratio);
      const vitlens::MatRM got = vitlens::attention_rollout(r, options);
      const NpyArray want = read_npy(kForeignDir + ro.at("file").get<std::string>());
      REQUIRE(want.shape == std::vector<int64_t>{r.tokens, r.tokens});
      const double diff = max_abs_diff(got.data(), want.values.data(), want.values.size());
      CHECK(diff <= 1e-5);
      // Every row is a distribution over the input tokens.
      for (int i = 0; i < r.tokens; ++i) CHECK(got.row(i).sum() == Approx(1.0).epsilon(1e-5));
      // The class token's map leaves the prefix tokens out.
      const vitlens::MatRM map = vitlens::rollout_map(got, r, 0);
      CHECK(map.rows() == r.grid_h);
      CHECK(map(0, 0) == got(0, r.prefix));
      ++checked;
    }
  }
  CHECK(checked == 12);
}

TEST_CASE("attention rollout refuses what it cannot compute", "[rollout]") {
  vitlens::ForwardResult r;
  r.tokens = 5;
  r.layers.resize(2);
  using Catch::Contains;
  CHECK_THROWS_WITH(vitlens::attention_rollout(r, {}), Contains("keep_probs"));
  vitlens::RolloutOptions bad;
  bad.last_layer = 2;
  CHECK_THROWS_WITH(vitlens::attention_rollout(r, bad), Contains("out of range"));
  bad.last_layer = -1;
  bad.discard_ratio = 1.0f;
  CHECK_THROWS_WITH(vitlens::attention_rollout(r, bad), Contains("[0, 1)"));
}

TEST_CASE("DINO's top-mass threshold keeps the patches holding the top share of the mass", "[rollout][threshold]") {
  // The one threshold the CLI and the viewer use (maps.hpp keep_top_mass), worked by hand with
  // DINO's rule (sort ascending, normalise, cumsum > 1 - threshold): values 0.5 0.1 / 0.3 0.1 ->
  // ascending 0.1 0.1 0.3 0.5, cumsum 0.1 0.2 0.5 1.0; with 0.6 the last two (> 0.4) stay.
  auto kept = [](const vitlens::MatRM& m, float mass) {
    return vitlens::MatRM((vitlens::keep_top_mass(m, mass).kept_map.array() > 0.0f).cast<float>());
  };
  vitlens::MatRM map(2, 2);
  map << 0.5f, 0.1f, 0.3f, 0.1f;
  vitlens::MatRM want(2, 2);
  want << 1.0f, 0.0f, 1.0f, 0.0f;
  CHECK(kept(map, 0.6f) == want);
  // 0.4: cumsum > 0.6 only for the 0.5 entry.
  want << 1.0f, 0.0f, 0.0f, 0.0f;
  CHECK(kept(map, 0.4f) == want);
  // 1.0 keeps every patch with any mass; an all-zero map has no structure and keeps no mass.
  CHECK(kept(map, 1.0f).sum() == 4.0f);
  const vitlens::ThresholdResult zero = vitlens::keep_top_mass(vitlens::MatRM::Zero(3, 3), 0.6f);
  CHECK(zero.no_structure);
  CHECK(zero.kept_map.sum() == 0.0f);
  // Unnormalised input: the same mask as the normalised one.
  CHECK(kept(map * 7.0f, 0.6f) == kept(map, 0.6f));
}
