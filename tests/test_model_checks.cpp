// What a model file or the engine must refuse rather than show wrong attention.
#include <catch2/catch.hpp>

#include <limits>

#include <opencv2/imgcodecs.hpp>

#include "test_support.hpp"
#include "core/base/error.hpp"
#include "core/render/export.hpp"

using namespace vitlens;

TEST_CASE("tensors the config does not use are refused, naming the tensor", "[model]") {
  const VitConfig c = test::small_config();
  for (const char* extra : {"blocks.0.ls1.gamma", "blocks.1.norm1.weight", "reg_token", "fc_norm.weight"}) {
    TensorMap t = test::random_tensors(c, 3);
    TensorData d;
    d.shape = {48};
    d.values.assign(48, 1.0f);
    t.emplace(extra, d);
    CHECK_THROWS_WITH(model_from_tensors(c, t, "m.safetensors"),
                      Catch::Contains("m.safetensors") && Catch::Contains(extra) && Catch::Contains("not part of"));
  }
}

TEST_CASE("MLP hidden size follows timm's int(D * mlp_ratio) in double precision", "[model][config]") {
  VitConfig c = test::small_config();
  c.embed_dim = 90;
  c.num_heads = 6;
  c.mlp_ratio = 0.7;  // 90 * 0.7 = 62.99999... in double: int() gives 62, as Python does
  CHECK(c.mlp_hidden() == 62);
  CHECK(c.validate().empty());
  c.mlp_ratio = 0.001;
  CHECK_THAT(c.validate(), Catch::Contains("hidden size") && Catch::Contains("= 0"));
}

TEST_CASE("an attention pool is refused where it would not be the one vitlens computes", "[model][config][pool]") {
  VitConfig c = test::small_config();
  c.attention_pool = true;
  CHECK(c.validate().empty());
  for (const char* option : {"swiglu", "mlp_norm", "rms_norm"}) {
    VitConfig o = c;
    o.swiglu = std::string(option) == "swiglu";
    o.mlp_norm = std::string(option) == "mlp_norm";
    o.rms_norm = std::string(option) == "rms_norm";
    CHECK_THAT(o.validate(), Catch::Contains("attention_pool") && Catch::Contains(option));
  }
  VitConfig prefix = c;
  prefix.pool_include_prefix = true;
  CHECK_THAT(prefix.validate(), Catch::Contains("pool_include_prefix"));
  VitConfig map = test::small_config();
  map.head_pool = HeadPool::Map;
  CHECK_THAT(map.validate(), Catch::Contains("global_pool 'map' needs an attention pool"));
  map.attention_pool = true;
  CHECK(map.validate().empty());
}

TEST_CASE("normalisation out of range and non-finite activations are errors, not blank maps", "[model][vit]") {
  VitConfig c = test::small_config();
  c.std = {1e-30f, 0.5f, 0.5f};
  CHECK_THAT(c.validate(), Catch::Contains("std[0]"));
  c = test::small_config();
  c.mean = {0.5f, 1e30f, 0.5f};
  CHECK_THAT(c.validate(), Catch::Contains("mean[1]"));

  // Weights so large that the queries overflow float: the forward pass stops with a message.
  TensorMap t = test::random_tensors(c, 5);
  for (float& v : t.at("blocks.0.attn.qkv.weight").values) v = 3e38f;  // finite, but their sums are not
  const VitModel m = model_from_tensors(c, t, "huge");
  PatchGrid g;
  g.grid_h = g.grid_w = 2;
  g.patches = MatRM::Constant(4, 48, 3.0f);
  g.patches(1, 3) = -2.0f;
  g.patch_is_padding.assign(4, 0);
  CHECK_THROWS_WITH(forward(m, g, ForwardOptions{}), Catch::Contains("non-finite"));
  // One NaN pixel value, in the first patch or the last (whose q, k, v end the (N, 3D) block):
  // NaN, not an infinity, in one token's row; D = 20 makes that block 5 x 60 = 300 floats, so the
  // last row ends in the check's tail after its blocks of 8.
  VitConfig narrow = test::small_config();
  narrow.embed_dim = 20;
  const VitModel fine = test::random_model(narrow, 5);
  for (int patch : {0, 3}) {
    PatchGrid nan_grid = g;
    nan_grid.patches(patch, 47) = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH(forward(fine, nan_grid, ForwardOptions{}), Catch::Contains("non-finite"));
  }
  PatchGrid finite_grid = g;  // the same model on finite pixels: no error
  CHECK_NOTHROW(forward(fine, finite_grid, ForwardOptions{}));

  // Finite queries and keys, but a score scale so large that the scores overflow.
  const VitModel ok = test::random_model(test::small_config(), 5);
  ForwardOptions huge_scale;
  huge_scale.score_scale = 3e38f;
  CHECK_THROWS_WITH(forward(ok, g, huge_scale), Catch::Contains("overflow"));
}

TEST_CASE("raw export refuses an analysis without the full weights", "[export]") {
  const VitModel m = test::random_model(test::small_config(), 2);
  const std::string dir = test::temp_dir("rawcheck");
  cv::Mat img(8, 8, CV_8UC3, cv::Scalar(10, 200, 30));
  REQUIRE(cv::imwrite(dir + "/a.png", img));
  ExportSettings s;
  s.out_dir = dir;
  const ImageAnalysis a = analyse_image(m, dir + "/a.png", s);  // computed without keep_probs
  s.raw = true;
  CHECK_THROWS_WITH(write_export(m, a, s), Catch::Contains("full weights"));
  // No class token: the sidecar says null, not 0, for the class token's weight.
  const VitModel no_cls = test::random_model(test::small_config(16, false), 2);
  s.raw = false;
  const ImageAnalysis b = analyse_image(no_cls, dir + "/a.png", s);
  const auto j = export_sidecar(no_cls, b, s);
  CHECK(j["heads"][0]["class_token_weight"].is_null());
  CHECK(j["alpha"].get<double>() == 0.6);
}
