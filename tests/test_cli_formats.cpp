// `vitlens info` / `export` on published checkpoints: layouts, --heads, --layer ranges, --rollout.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <sys/wait.h>

#include "npy_support.hpp"
#include "process_support.hpp"
#include "test_support.hpp"

namespace {

// A square float32 .npy (the rollout references), read with npy_support.hpp.
struct NpyArrayLite {
  int n = 0;
  std::vector<float> values;
  float at(int row, int col) const { return values[static_cast<size_t>(row) * static_cast<size_t>(n) + static_cast<size_t>(col)]; }
};
NpyArrayLite read_rollout_npy(const std::string& path) {
  const NpyArray a = read_npy(path);
  NpyArrayLite out;
  if (a.shape.size() == 2 && a.shape[0] == a.shape[1]) out.n = static_cast<int>(a.shape[0]);
  out.values = a.values;
  return out;
}

const std::string kForeign = std::string(VITLENS_TEST_FIXTURES) + "/foreign/";

using Run = vitlens::test::ShellRun;
using vitlens::test::slurp;

Run run(const std::string& args) {
  static const std::string dir = vitlens::test::temp_dir("cli-formats");
  return vitlens::test::run_vitlens_shell(dir, args);
}

}  // namespace

TEST_CASE("cli: info names the layout, the options and what was inferred", "[cli][formats]") {
  const Run reg = run("info --model " + kForeign + "timm_dinov2_reg/model.safetensors");
  CHECK(reg.code == 0);
  CHECK_THAT(reg.out, Catch::Contains("layout:       timm") && Catch::Contains("registers:    4 (tokens 1 to 4)") &&
                          Catch::Contains("patches only (no_embed_class)") && Catch::Contains("LayerScale"));
  const Run clip = run("info --model " + kForeign + "hf_clip/model.safetensors");
  CHECK(clip.code == 0);
  CHECK_THAT(clip.out, Catch::Contains("hf-clip") && Catch::Contains("quick_gelu") && Catch::Contains("pre-norm") &&
                           Catch::Contains("inferred:     post_layernorm ignored"));

  const std::string dir = vitlens::test::temp_dir("cli-formats-bare");
  std::ofstream(dir + "/model.safetensors", std::ios::binary) << slurp(kForeign + "timm_vit/model.safetensors");
  const Run bare = run("info --model " + dir + "/model.safetensors");
  CHECK(bare.code == 1);
  CHECK_THAT(bare.err, Catch::Contains("pass --heads"));
  CHECK(std::count(bare.err.begin(), bare.err.end(), '\n') == 1);
  const Run heads = run("info --model " + dir + "/model.safetensors --heads 3");
  CHECK(heads.code == 0);
  CHECK_THAT(heads.out, Catch::Contains("inferred:     num_heads 3 from --heads"));
  CHECK(run("info --model " + dir + "/model.safetensors --heads 0").code == 2);
}

TEST_CASE("cli: a refusal names what is missing or wrong: a config.json without architecture, --lr nan",
          "[cli][formats]") {
  const std::string dir = vitlens::test::temp_dir("cli-formats-noarch");
  const std::string model = dir + "/model.safetensors";
  std::ofstream(model, std::ios::binary) << slurp(kForeign + "timm_vit/model.safetensors");
  const Run bare = run("info --model " + model);
  CHECK(bare.code == 1);
  CHECK_THAT(bare.err, Catch::Contains("(width 24; no config.json beside it): pass --heads"));
  // A config.json is there, but says neither the architecture nor the heads.
  std::ofstream(dir + "/config.json") << R"({"model_args": {"img_size": 16}})";
  const Run no_arch = run("info --model " + model);
  CHECK(no_arch.code == 1);
  CHECK_THAT(no_arch.err,
             Catch::Contains("(width 24; config.json has neither 'architecture' nor model_args.num_heads): pass --heads"));
  CHECK(std::count(no_arch.err.begin(), no_arch.err.end(), '\n') == 1);
  // An architecture whose size word does not match the width.
  std::ofstream(dir + "/config.json") << R"({"architecture": "vit_small_patch16_224", "model_args": {"img_size": 16}})";
  const Run odd_width = run("info --model " + model);
  CHECK(odd_width.code == 1);
  CHECK_THAT(odd_width.err, Catch::Contains("config.json has no model_args.num_heads and architecture "
                                            "'vit_small_patch16_224' names no standard width of 24): pass --heads"));
  // --heads against model_args.num_heads names where the count came from.
  std::ofstream(dir + "/config.json") << R"({"model_args": {"img_size": 16, "num_heads": 3}})";
  CHECK_THAT(run("info --model " + model + " --heads 6").err,
             Catch::Contains("--heads 6 contradicts config.json (model_args.num_heads says 3 heads)"));

  // A float flag's bad value as the user wrote it, not a JSON dump's "null".
  for (const char* lr : {"nan", "inf", "1e400"}) {
    const Run r = run(std::string("train --data fashion-mnist --out ") + dir + "/run --lr " + lr);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(std::string("--lr must be in (0, 10], got ") + (lr[0] == 'n' ? "nan" : "inf")));
    CHECK_THAT(r.err, !Catch::Contains("null"));
  }
  // --seed is a whole number within 64 bits (the conversion alone made -1 into 2^64 - 1).
  for (const char* seed : {"-1", "-5", "99999999999999999999", "12a", "1.5"}) {
    const Run r = run(std::string("train --data fashion-mnist --out ") + dir + "/run --seed " + seed);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(std::string("--seed: must be a whole number from 0 to 18446744073709551615, got ") + seed));
  }
  // Rollout's flags without --rollout would change nothing: refused.
  for (const char* flag : {"--fusion max", "--discard 0.5"}) {
    const Run r = run("export " + dir + "/picture.png --out " + dir + "/x " + flag);  // refused before the image is read
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(std::string(flag).substr(0, std::string(flag).find(' ')) + " requires --rollout"));
  }
}

TEST_CASE("cli: --layer all writes every layer and a layers x heads montage", "[cli][formats]") {
  const std::string out = vitlens::test::temp_dir("cli-layers");
  const std::string model = kForeign + "timm_deit_distilled/model.safetensors";
  const Run r = run("export " + kForeign + "image.png --model " + model + " --layer all --quiet --out " + out);
  REQUIRE(r.code == 0);
  for (int l = 0; l < 2; ++l) {
    const nlohmann::json j = nlohmann::json::parse(slurp(out + "/image_layer" + std::to_string(l) + ".json"));
    CHECK(j["layer"] == l);
    CHECK(j["prefix_tokens"] == 2);  // class + distillation
    CHECK(j["heads"][0]["prefix_weights"].size() == 2);
  }
  const cv::Mat grid = cv::imread(out + "/image_layers_montage.png");
  const cv::Mat one = cv::imread(out + "/image_layer0_montage.png");
  REQUIRE_FALSE(grid.empty());
  REQUIRE_FALSE(one.empty());
  CHECK(grid.cols >= 4 * 16);  // 4 columns (3 heads + mean) of 16 px tiles
  CHECK(grid.rows >= 2 * 16);  // 2 rows (layers)

  CHECK(run("export " + kForeign + "image.png --model " + model + " --layer 1-0 --out " + out).code == 2);
  CHECK(run("export " + kForeign + "image.png --model " + model + " --layer 0-2 --out " + out).code == 2);
  CHECK(run("export " + kForeign + "image.png --model " + model + " --layer 1x --out " + out).code == 2);
}

TEST_CASE("cli: --rollout writes the class token's rollout map", "[cli][formats][rollout]") {
  const std::string out = vitlens::test::temp_dir("cli-rollout");
  const Run r = run("export " + kForeign + "image.png --model " + kForeign +
                    "timm_dinov2_reg/model.safetensors --rollout --fusion min --discard 0.9 --quiet --out " + out);
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(slurp(out + "/image_rollout.json"));
  CHECK(j["query"]["name"] == "class token");
  CHECK(j["rollout"]["head_fusion"] == "min");
  // A rollout row is a distribution over the input tokens: patches (the map) plus prefix tokens.
  double total = j["map"]["sum"].get<double>();
  for (const auto& w : j["prefix_weights"]) total += w.get<double>();
  CHECK(total == Approx(1.0).epsilon(1e-5));
  CHECK_FALSE(cv::imread(out + "/image_rollout.png").empty());
  // How the pass was made, as the maps' records say it.
  CHECK(j["precision"] == "fp32");
  CHECK(j["preprocess"] == "whole");
  CHECK_FALSE(j.contains("transform"));
  const Run own = run("export " + kForeign + "image.png --model " + kForeign +
                      "timm_dinov2_reg/model.safetensors --rollout --preprocess model --precision bf16 --quiet --out " + out);
  INFO(own.err);
  REQUIRE(own.code == 0);
  const nlohmann::json k = nlohmann::json::parse(slurp(out + "/image_rollout.json"));
  CHECK(k["precision"] == "bf16");
  CHECK(k["preprocess"] == "model");
  CHECK_THAT(k["transform"]["library"].get<std::string>(), Catch::StartsWith("timm"));
  CHECK(run("export " + kForeign + "image.png --model " + kForeign + "timm_vit/model.safetensors --rollout --discard 1 --out " + out)
            .code == 2);
}

TEST_CASE("cli: --threshold keeps DINO's top mass of a foreign model's class-token maps", "[cli][formats][threshold]") {
  const std::string out = vitlens::test::temp_dir("cli-threshold");
  const Run r = run("export " + kForeign + "image.png --model " + kForeign + "timm_dino/model.safetensors --cls --threshold 0.6 --quiet --out " +
                    out);
  REQUIRE(r.code == 0);
  std::ifstream in(out + "/image.json");
  REQUIRE(in);
  nlohmann::json j;
  in >> j;
  CHECK(j["threshold"]["mass"] == 0.6);
  REQUIRE(j["threshold"]["heads_then_mean"].size() == 4);  // 3 heads and the mean
  for (const auto& t : j["threshold"]["heads_then_mean"]) {
    CHECK(t["kept_mass"].get<double>() >= 0.6);
    CHECK(t["kept_patches"].get<int>() < t["total_patches"].get<int>());
  }
  CHECK_FALSE(cv::imread(out + "/image_montage.png").empty());
  CHECK(run("export " + kForeign + "image.png --model " + kForeign + "timm_dino/model.safetensors --threshold 0 --out " + out).code == 2);
}

TEST_CASE("cli: --token makes a prefix token the query, for maps and rollout, one line for a token the model lacks",
          "[cli][formats][token]") {
  const std::string out = vitlens::test::temp_dir("cli-token");
  const std::string image = kForeign + "image.png", reg_model = kForeign + "timm_dinov2_reg/model.safetensors";
  Run r = run("export " + image + " --model " + reg_model + " --token reg3 --layer 0 --quiet --out " + out);
  INFO(r.err);
  REQUIRE(r.code == 0);
  nlohmann::json j = nlohmann::json::parse(slurp(out + "/image.json"));
  CHECK(j["mode"] == "query");
  CHECK(j["query"]["token"] == 4);  // class token, then registers 0..3
  CHECK(j["query"]["name"] == "register 3");
  CHECK(j["query"]["prefix"] == "reg3");

  // Rollout from register 0, against the numpy rollout of the library's weights (the fixture
  // script's reference, (N, N) for fusion mean and no discard): the row's patch part, max and sum.
  r = run("export " + image + " --model " + reg_model + " --rollout --token reg0 --quiet --out " + out);
  REQUIRE(r.code == 0);
  j = nlohmann::json::parse(slurp(out + "/image_rollout.json"));
  CHECK(j["query"]["name"] == "register 0");
  const NpyArrayLite reference = read_rollout_npy(kForeign + "timm_dinov2_reg/rollout_mean_0.0.npy");
  REQUIRE(reference.n == 21);
  double max_value = 0.0, sum = 0.0;
  for (int key = 5; key < 21; ++key) {  // the 16 patch keys after the class token and 4 registers
    max_value = std::max(max_value, static_cast<double>(reference.at(1, key)));
    sum += reference.at(1, key);
  }
  CHECK(j["map"]["max"].get<double>() == Approx(max_value).margin(1e-5));
  CHECK(j["map"]["sum"].get<double>() == Approx(sum).margin(1e-5));

  // Distilled DeiT has a distillation token; the others say which tokens they have.
  r = run("export " + image + " --model " + kForeign + "timm_deit_distilled/model.safetensors --token dist --quiet --out " + out);
  CHECK(r.code == 0);
  struct Bad {
    std::string model, token, text;
  };
  for (const Bad& bad : {Bad{"timm_vit", "dist", "no distillation token"}, Bad{"timm_vit", "reg0", "no register tokens"},
                         Bad{"timm_dinov2_reg", "reg4", "reg0 to reg3"}, Bad{"timm_dinov2_reg", "head", "expects cls, dist or regK"}}) {
    INFO(bad.model << " --token " << bad.token);
    r = run("export " + image + " --model " + kForeign + bad.model + "/model.safetensors --token " + bad.token + " --out " + out);
    CHECK(r.code == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, Catch::Contains(bad.text));
  }
  // --token is a query: it cannot go with another one.
  r = run("export " + image + " --model " + reg_model + " --token cls --patch 1,1 --out " + out);
  CHECK(r.code != 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}
