// Checkpoints as timm and Hugging Face transformers publish them, against those libraries' own
// forward: every layer's attention (class, distillation and register tokens included) and the
// final tokens, to 1e-5.
//
// The fixtures come from tests/fixtures/make_foreign_fixtures.py, which builds each model with
// the real library (timm 1.0.31, transformers 5.25; pretrained=False, small, seeded random
// weights), saves it as the library does (timm save_for_hf: model.safetensors + config.json;
// transformers save_pretrained) and records probs (L, H, N, N) and the output (N, D) of a float64
// forward on exactly the saved values. vitlens opens the folder's model.safetensors as a user
// would, with nothing but the files beside it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "npy_support.hpp"
#include "core/io/image.hpp"
#include "core/render/maps.hpp"
#include "models/model_io.hpp"
#include "models/safetensors.hpp"
#include "core/model/vit.hpp"
#include "core/train/vit_train.hpp"

namespace {

const std::string kForeignDir = std::string(VITLENS_TEST_FIXTURES) + "/foreign/";

nlohmann::json foreign_manifest() { return nlohmann::json::parse(npy_file_bytes(kForeignDir + "manifest.json")); }

}  // namespace

TEST_CASE("timm and Hugging Face checkpoints match their libraries' forward", "[parity][formats]") {
  const nlohmann::json manifest = foreign_manifest();
  const double tolerance = manifest.at("tolerance").get<double>();
  REQUIRE(tolerance == Approx(1e-5));
  // the script writes sixteen, four with an attention pool and ten of the rotary / SwiGLU / RMSNorm
  // families; fewer means stale fixtures
  REQUIRE(manifest.at("cases").size() == 16 + 4 + 10);
  const cv::Mat rgb = vitlens::load_image_rgb(kForeignDir + manifest.at("image").get<std::string>());

  for (const auto& c : manifest.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    SECTION(name) {
      INFO("case " << name << " (" << c.at("source").get<std::string>() << ")");
      const vitlens::VitModel model = vitlens::load_model(kForeignDir + c.at("model").get<std::string>());
      const vitlens::VitConfig& config = model.config;
      const vitlens::PreparedImage image = vitlens::prepare_image(rgb, config, 0 /* native size */);
      REQUIRE_FALSE(image.resized);
      vitlens::ForwardOptions options;
      options.keep_probs = true;
      const vitlens::ForwardResult result = vitlens::forward(model, image.grid, options);

      const NpyArray probs = read_npy(kForeignDir + c.at("probs").get<std::string>());    // (L, H, N, N)
      const NpyArray output = read_npy(kForeignDir + c.at("output").get<std::string>());  // (N, D)
      const int L = config.depth, H = config.num_heads, N = result.tokens, D = config.embed_dim;
      REQUIRE(probs.shape == std::vector<int64_t>{L, H, N, N});
      REQUIRE(output.shape == std::vector<int64_t>{N, D});
      REQUIRE(N == c.at("tokens").get<int>());

      double worst_probs = 0.0, worst_row = 0.0;
      for (int l = 0; l < L; ++l) {
        for (int h = 0; h < H; ++h) {
          INFO("layer " << l << " head " << h);
          const vitlens::MatRM& got = result.layers[static_cast<size_t>(l)].probs[static_cast<size_t>(h)];
          const float* want = probs.values.data() + (static_cast<size_t>(l) * H + h) * N * N;
          const double diff = max_abs_diff(got.data(), want, static_cast<size_t>(N) * N);
          CHECK(diff <= tolerance);
          worst_probs = std::max(worst_probs, diff);
          // Every prefix token's own row (class, distillation, registers) through attention_row,
          // the path the maps and the inspector use.
          std::vector<float> row(static_cast<size_t>(N));
          for (int query = 0; query <= result.prefix && query < N; ++query) {
            vitlens::attention_row(model, result, l, h, query, row.data());
            const double row_diff = max_abs_diff(row.data(), want + static_cast<size_t>(query) * N, static_cast<size_t>(N));
            CHECK(row_diff <= tolerance);
            worst_row = std::max(worst_row, row_diff);
          }
        }
      }
      const double worst_output = max_abs_diff(result.output.data(), output.values.data(), output.values.size());
      CHECK(worst_output <= tolerance);
      // The attention pool (SigLIP's head): its latent query's weights over the patch tokens
      // (H, Np) and the pooled vector (D), as the library's head computes them.
      std::string pool_text;
      CHECK(config.attention_pool == c.contains("pool_probs"));
      if (c.contains("pool_probs")) {
        const NpyArray pool = read_npy(kForeignDir + c.at("pool_probs").get<std::string>());  // (H, Np)
        const NpyArray pooled = read_npy(kForeignDir + c.at("pooled").get<std::string>());    // (D)
        const int patches = N - result.prefix;
        REQUIRE(pool.shape == std::vector<int64_t>{H, patches});
        REQUIRE(pooled.shape == std::vector<int64_t>{D});
        REQUIRE(result.pool_probs.rows() == H);
        REQUIRE(result.pool_probs.cols() == N);
        double worst_pool = 0.0;
        for (int h = 0; h < H; ++h) {
          worst_pool = std::max(worst_pool, max_abs_diff(result.pool_probs.row(h).data() + result.prefix,
                                                         pool.values.data() + static_cast<size_t>(h) * patches,
                                                         static_cast<size_t>(patches)));
          for (int t = 0; t < result.prefix; ++t) CHECK(result.pool_probs(h, t) == 0.0f);  // the pool reads patches only
        }
        CHECK(worst_pool <= tolerance);
        REQUIRE(result.pooled.size() == D);
        const double worst_pooled = max_abs_diff(result.pooled.data(), pooled.values.data(), pooled.values.size());
        CHECK(worst_pooled <= tolerance);
        std::ostringstream text;
        text << ", pool probs " << worst_pool << ", pooled " << worst_pooled;
        pool_text = text.str();
      } else {
        CHECK(result.pool_probs.size() == 0);
        CHECK(result.pooled.size() == 0);
      }
      WARN(name << " [" << model.format << "]: max |diff| probs " << worst_probs << ", attention_row " << worst_row
                << ", output " << worst_output << pool_text);
    }
  }
}

TEST_CASE("checkpoints get the options of their family", "[formats]") {
  struct Expect {
    const char* name;
    const char* format;
    bool cls, dist;
    int registers;
    bool pos_prefix, pre_norm, layer_scale, final_norm, patch_bias;
    vitlens::Activation act;
    float eps;
    int classes;
  };
  using A = vitlens::Activation;
  const Expect expects[] = {
      {"timm_vit", "timm", true, false, 0, true, false, false, true, true, A::Gelu, 1e-6f, 5},
      {"timm_deit_distilled", "timm", true, true, 0, true, false, false, true, true, A::Gelu, 1e-6f, 4},
      {"timm_dino", "timm", true, false, 0, true, false, false, true, true, A::Gelu, 1e-6f, 0},
      {"timm_dinov2", "timm", true, false, 0, true, false, true, true, true, A::Gelu, 1e-6f, 0},
      {"timm_dinov2_reg", "timm", true, false, 4, false, false, true, true, true, A::Gelu, 1e-6f, 0},
      {"timm_clip", "timm", true, false, 0, true, true, false, true, false, A::QuickGelu, 1e-5f, 0},
      {"hf_vit", "hf-vit", true, false, 0, true, false, false, true, true, A::Gelu, 1e-12f, 0},
      {"hf_vit_cls", "hf-vit", true, false, 0, true, false, false, true, true, A::Gelu, 1e-12f, 3},
      {"hf_dinov2", "hf-dinov2", true, false, 0, true, false, true, true, true, A::Gelu, 1e-6f, 0},
      {"hf_dinov2_reg", "hf-dinov2", true, false, 2, false, false, true, true, true, A::Gelu, 1e-6f, 0},
      {"hf_clip", "hf-clip", true, false, 0, true, true, false, false, false, A::QuickGelu, 1e-5f, 0},
      {"timm_rpn", "timm", false, false, 0, true, false, false, false, true, A::Gelu, 1e-6f, 0},
      {"timm_dinov2_dynamic", "timm", true, false, 0, true, false, true, true, true, A::Gelu, 1e-6f, 0},
      {"timm_siglip_gap", "timm", false, false, 0, true, false, false, true, true, A::GeluTanh, 1e-6f, 0},
      {"hf_deit", "hf-deit", true, true, 0, true, false, false, true, true, A::Gelu, 1e-12f, 0},
      {"hf_deit_teacher", "hf-deit", true, true, 0, true, false, false, true, true, A::Gelu, 1e-12f, 3},
      {"timm_siglip_map", "timm", false, false, 0, true, false, false, true, true, A::GeluTanh, 1e-6f, 0},
      {"timm_siglip1_map", "timm", false, false, 0, true, false, false, true, true, A::Gelu, 1e-6f, 0},
      {"timm_reg_map", "timm", false, false, 4, true, false, false, true, true, A::Gelu, 1e-6f, 0},
      {"hf_siglip", "hf-siglip", false, false, 0, true, false, false, true, true, A::GeluTanh, 1e-6f, 0},
  };
  for (const Expect& e : expects) {
    INFO(e.name);
    const vitlens::VitModel m = vitlens::load_model(kForeignDir + e.name + "/model.safetensors");
    const vitlens::VitConfig& c = m.config;
    CHECK(m.format == e.format);
    CHECK(c.class_token == e.cls);
    CHECK(c.dist_token == e.dist);
    CHECK(c.register_tokens == e.registers);
    CHECK(c.pos_embed_prefix == e.pos_prefix);
    CHECK(c.pre_norm == e.pre_norm);
    CHECK(c.layer_scale == e.layer_scale);
    CHECK(c.final_norm == e.final_norm);
    CHECK(c.patch_bias == e.patch_bias);
    CHECK(c.act == e.act);
    CHECK(c.norm_eps == Approx(e.eps));
    CHECK(m.w.num_classes == e.classes);
    CHECK(c.embed_dim == 24);
    CHECK(c.num_heads == 3);
    CHECK(c.depth == 2);
    CHECK(c.patch_size == 4);
    CHECK(c.img_h == 16);
    // timm's ResPostBlock is the one family with post-norm blocks.
    CHECK(c.post_norm == (std::string(e.name) == "timm_rpn"));
    // The attention-pool head: timm global_pool 'map' and transformers' SigLIP head.
    CHECK(c.attention_pool == (std::string(e.name).find("_map") != std::string::npos || std::string(e.name) == "hf_siglip"));
  }
}

TEST_CASE("register and distillation tokens: in the token list, out of the patch maps", "[formats]") {
  const vitlens::VitModel m = vitlens::load_model(kForeignDir + "timm_dinov2_reg/model.safetensors");
  const vitlens::PreparedImage image = vitlens::prepare_image(vitlens::load_image_rgb(kForeignDir + "image.png"), m.config, 0);
  const vitlens::ForwardResult f = vitlens::forward(m, image.grid, {});
  REQUIRE(f.prefix == 5);
  REQUIRE(f.tokens == 5 + 16);
  CHECK(vitlens::token_name(m.config, f.grid_w, 0) == "class token");
  CHECK(vitlens::token_name(m.config, f.grid_w, 1) == "register 0");
  CHECK(vitlens::token_name(m.config, f.grid_w, 4) == "register 3");
  CHECK(vitlens::token_name(m.config, f.grid_w, 5) == "patch (row 0, col 0)");
  CHECK(vitlens::token_name(m.config, f.grid_w, 20) == "patch (row 3, col 3)");

  // A register as the query: its row over every token; the map keeps the patch keys only, and
  // the prefix keys' weights are reported beside it. Together they are the whole row (sum 1).
  vitlens::MapRequest request;
  request.mode = vitlens::MapMode::Query;
  request.layer = 1;
  request.query_token = 2;  // register 1
  const vitlens::HeadMaps maps = vitlens::attention_maps(m, f, request);
  REQUIRE(maps.prefix_weight.rows() == 3);
  REQUIRE(maps.prefix_weight.cols() == 5);
  std::vector<float> row(static_cast<size_t>(f.tokens));
  for (int h = 0; h < 3; ++h) {
    vitlens::attention_row(m, f, 1, h, 2, row.data());
    CHECK(maps.heads[static_cast<size_t>(h)].rows() == 4);
    CHECK(maps.heads[static_cast<size_t>(h)](0, 0) == row[5]);
    for (int t = 0; t < 5; ++t) CHECK(maps.prefix_weight(h, t) == row[static_cast<size_t>(t)]);
    CHECK(maps.cls_weight[static_cast<size_t>(h)] == row[0]);
    CHECK(maps.heads[static_cast<size_t>(h)].sum() + maps.prefix_weight.row(h).sum() == Approx(1.0).epsilon(1e-5));
  }

  const vitlens::VitModel deit = vitlens::load_model(kForeignDir + "timm_deit_distilled/model.safetensors");
  CHECK(vitlens::token_name(deit.config, 4, 1) == "distillation token");
  CHECK(vitlens::token_name(deit.config, 4, 2) == "patch (row 0, col 0)");
}

TEST_CASE("a residual post-norm ViT is not a pre-norm one", "[parity][formats]") {
  // The same tensors read as pre-norm blocks give other attention: the option is what matches
  // timm (the parity case above), not a detail the numbers would not show.
  const vitlens::VitModel post = vitlens::load_model(kForeignDir + "timm_rpn/model.safetensors");
  REQUIRE(post.config.post_norm);
  vitlens::VitConfig pre_config = post.config;
  pre_config.post_norm = false;
  vitlens::SafetensorsFile file = vitlens::read_safetensors(kForeignDir + "timm_rpn/model.safetensors");
  file.tensors.erase("fc_norm.weight");
  file.tensors.erase("fc_norm.bias");
  const vitlens::VitModel pre = vitlens::model_from_tensors(pre_config, file.tensors, "pre-norm reading");
  const cv::Mat rgb = vitlens::load_image_rgb(kForeignDir + "image.png");
  vitlens::ForwardOptions options;
  options.keep_probs = true;
  const auto a = vitlens::forward(post, vitlens::prepare_image(rgb, post.config, 0).grid, options);
  const auto b = vitlens::forward(pre, vitlens::prepare_image(rgb, pre.config, 0).grid, options);
  const vitlens::MatRM& pa = a.layers[1].probs[0];
  const vitlens::MatRM& pb = b.layers[1].probs[0];
  CHECK(max_abs_diff(pa.data(), pb.data(), static_cast<size_t>(pa.size())) > 0.05);
}

TEST_CASE("timm reads model_args.img_size over pretrained_cfg.input_size, as timm builds the model", "[formats]") {
  // dynamic_img_size=True: timm keeps the weights' 518 in pretrained_cfg and builds at img_size.
  const nlohmann::json cfg = nlohmann::json::parse(npy_file_bytes(kForeignDir + "timm_dinov2_dynamic/config.json"));
  REQUIRE(cfg.at("pretrained_cfg").at("input_size") == nlohmann::json({3, 518, 518}));
  const vitlens::VitModel m = vitlens::load_model(kForeignDir + "timm_dinov2_dynamic/model.safetensors");
  CHECK(m.config.img_h == 16);
  CHECK(m.config.img_w == 16);
  bool said = false;
  for (const std::string& note : m.notes) said |= note.find("model_args.img_size") != std::string::npos && note.find("518x518") != std::string::npos;
  CHECK(said);
}

// [SECTION] Rotary position embeddings, SwiGLU and RMSNorm (DINOv3, EVA-02, DINOv3ViT, DINOv2 giant)

namespace {

// A PatchGrid from the library's own normalised input (1, 3, H, W) float32: rows (c, y, x) per patch.
vitlens::PatchGrid grid_from_pixels(const NpyArray& pixels, int patch) {
  REQUIRE(pixels.shape.size() == 4);
  const int h = static_cast<int>(pixels.shape[2]), w = static_cast<int>(pixels.shape[3]);
  vitlens::PatchGrid grid;
  grid.grid_h = h / patch;
  grid.grid_w = w / patch;
  grid.patches.resize(grid.grid_h * grid.grid_w, 3 * patch * patch);
  for (int r = 0; r < grid.grid_h; ++r)
    for (int c = 0; c < grid.grid_w; ++c)
      for (int ch = 0; ch < 3; ++ch)
        for (int y = 0; y < patch; ++y)
          for (int x = 0; x < patch; ++x)
            grid.patches(r * grid.grid_w + c, (ch * patch + y) * patch + x) =
                pixels.values[(static_cast<size_t>(ch) * h + r * patch + y) * w + c * patch + x];
  grid.patch_is_padding.assign(static_cast<size_t>(grid.grid_h * grid.grid_w), 0);
  return grid;
}

// The largest |difference| of every layer's probs and of the output against the library's.
void worst_differences(const vitlens::ForwardResult& result, const NpyArray& probs, const NpyArray& output, double& dp,
                       double& dout) {
  const int L = static_cast<int>(result.layers.size()), N = result.tokens;
  const int H = static_cast<int>(result.layers.at(0).probs.size());
  REQUIRE(probs.shape == std::vector<int64_t>{L, H, N, N});
  REQUIRE(output.values.size() == static_cast<size_t>(result.output.size()));
  dp = 0.0;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h)
      dp = std::max(dp, max_abs_diff(result.layers[static_cast<size_t>(l)].probs[static_cast<size_t>(h)].data(),
                                     probs.values.data() + (static_cast<size_t>(l) * H + h) * N * N,
                                     static_cast<size_t>(N) * N));
  dout = max_abs_diff(result.output.data(), output.values.data(), output.values.size());
}

// The forward on `grid` keeping every weight, against the case's probs.npy and output.npy.
void check_case_on_grid(const vitlens::VitModel& model, const vitlens::PatchGrid& grid, const nlohmann::json& c,
                        double tolerance, const std::string& what) {
  vitlens::ForwardOptions options;
  options.keep_probs = true;
  const vitlens::ForwardResult result = vitlens::forward(model, grid, options);
  double dp = 0.0, dout = 0.0;
  worst_differences(result, read_npy(kForeignDir + c.at("probs").get<std::string>()),
                    read_npy(kForeignDir + c.at("output").get<std::string>()), dp, dout);
  CHECK(dp <= tolerance);
  CHECK(dout <= tolerance);
  WARN(what << " [" << model.format << "] " << grid.grid_h << "x" << grid.grid_w << ": max |diff| probs " << dp
            << ", output " << dout);
}

}  // namespace

TEST_CASE("rotary SwiGLU and RMSNorm families get their options from the files", "[formats]") {
  struct Expect {
    const char* name;
    const char* format;
    vitlens::Rope rope;
    bool rotate_half;
    float temperature;
    int ref;  // the reference grid's side, 0 = none
    bool pos_embed, swiglu, mlp_norm, qkv_bias, layer_scale, final_norm;
    int registers, hidden;
    float eps;
    bool rms = false;
    bool attn_norm = false;
  };
  using R = vitlens::Rope;
  const Expect expects[] = {
      {"timm_dinov3", "timm", R::Dinov3, true, 100.0f, 0, false, false, false, false, true, true, 4, 48, 1e-5f},
      {"timm_dinov3_swiglu", "timm", R::Dinov3, true, 100.0f, 0, false, true, false, true, true, true, 4, 48, 1e-5f},
      {"timm_eva02", "timm", R::Eva, false, 10000.0f, 16, true, true, false, true, false, false, 0, 48, 1e-6f},
      {"timm_eva02_base", "timm", R::Eva, false, 10000.0f, 16, true, true, true, true, false, false, 0, 48, 1e-6f},
      {"hf_dinov3", "hf-dinov3", R::Dinov3, true, 100.0f, 0, false, false, false, true, true, true, 2, 48, 1e-5f},
      {"hf_dinov3_gated", "hf-dinov3", R::Dinov3, true, 100.0f, 0, false, true, false, true, true, true, 4, 48, 1e-5f},
      {"timm_dinov2_swiglu", "timm", R::None, false, 10000.0f, 0, true, true, false, true, true, true, 0, 24, 1e-6f},
      {"hf_dinov2_swiglu", "hf-dinov2", R::None, false, 10000.0f, 0, true, true, false, true, true, true, 0, 32, 1e-6f},
      {"timm_rmsnorm", "timm", R::None, false, 10000.0f, 0, true, false, false, true, false, true, 0, 48, 1e-6f, true},
      {"timm_eva02_clip", "timm", R::Eva, false, 10000.0f, 16, true, true, true, true, false, true, 0, 48, 1e-6f, false, true},
  };
  for (const Expect& e : expects) {
    INFO(e.name);
    const vitlens::VitModel m = vitlens::load_model(kForeignDir + e.name + "/model.safetensors");
    const vitlens::VitConfig& c = m.config;
    CHECK(m.format == e.format);
    CHECK(c.rope == e.rope);
    if (e.rope != R::None) {
      CHECK(c.rope_rotate_half == e.rotate_half);
      CHECK(c.rope_temperature == e.temperature);
      CHECK(c.rope_ref_h == e.ref);
      CHECK(c.rope_ref_w == e.ref);
    }
    CHECK(c.pos_embed == e.pos_embed);
    CHECK((m.w.pos_embed != nullptr) == e.pos_embed);
    CHECK(c.swiglu == e.swiglu);
    CHECK(c.mlp_norm == e.mlp_norm);
    CHECK(c.qkv_bias == e.qkv_bias);
    CHECK(c.layer_scale == e.layer_scale);
    CHECK(c.final_norm == e.final_norm);
    CHECK(c.register_tokens == e.registers);
    CHECK(c.mlp_hidden() == e.hidden);
    CHECK(c.norm_eps == Approx(e.eps));
    CHECK(c.rms_norm == e.rms);
    CHECK(c.attn_out_norm == e.attn_norm);
    CHECK(c.class_token);
    // `vitlens info` says what was read: the rotary embeddings and the gated MLP each in a note.
    bool rope_note = false, swiglu_note = false;
    for (const std::string& note : m.notes) {
      rope_note |= note.find("rotary position embeddings") != std::string::npos;
      swiglu_note |= note.find("silu(gate") != std::string::npos;
    }
    CHECK(rope_note == (e.rope != R::None));
    CHECK(swiglu_note == e.swiglu);
  }
}

TEST_CASE("rotary families match their libraries on a non-square grid", "[parity][formats]") {
  // The library run on a 16 x 24 input (a 4 x 6 grid): the rotary coordinates are those of that
  // grid (DINOv3 normalises each axis by its own size, EVA-02 rescales to its 16 x 16 reference
  // grid) and EVA-02's, DINOv2 giant's and the RMSNorm ViT's position tables are resampled as timm
  // does.
  const nlohmann::json manifest = foreign_manifest();
  const double tolerance = manifest.at("tolerance").get<double>();
  REQUIRE(manifest.at("nonsquare").size() == 9);
  for (const auto& c : manifest.at("nonsquare")) {
    const std::string name = c.at("case").get<std::string>();
    SECTION(name) {
      const vitlens::VitModel model = vitlens::load_model(kForeignDir + name + "/model.safetensors");
      const NpyArray pixels = read_npy(kForeignDir + c.at("pixels").get<std::string>());
      const vitlens::PatchGrid grid = grid_from_pixels(pixels, model.config.patch_size);
      REQUIRE(grid.grid_h == c.at("grid")[0].get<int>());
      REQUIRE(grid.grid_w == c.at("grid")[1].get<int>());
      REQUIRE(grid.grid_h != grid.grid_w);
      check_case_on_grid(model, grid, c, tolerance, name + " non-square");
    }
  }
}

TEST_CASE("rotary families match their libraries on a padded whole-image grid", "[parity][formats]") {
  // Whole-image mode: a 4 x 7 grid whose last column is padding. The rotary coordinates are those
  // of the whole padded grid, and the padding is masked as keys; the library given the same
  // pixels and its own attn_mask over those keys computes the same attention.
  const nlohmann::json manifest = foreign_manifest();
  const double tolerance = manifest.at("tolerance").get<double>();
  REQUIRE(manifest.at("padded").size() == 2);
  for (const auto& c : manifest.at("padded")) {
    const std::string name = c.at("case").get<std::string>();
    SECTION(name) {
      const vitlens::VitModel model = vitlens::load_model(kForeignDir + name + "/model.safetensors");
      vitlens::PatchGrid grid = grid_from_pixels(read_npy(kForeignDir + c.at("pixels").get<std::string>()), model.config.patch_size);
      REQUIRE(grid.grid_h == c.at("grid")[0].get<int>());
      REQUIRE(grid.grid_w == c.at("grid")[1].get<int>());
      const int padding = c.at("padding_columns").get<int>();
      for (int r = 0; r < grid.grid_h; ++r)
        for (int col = grid.grid_w - padding; col < grid.grid_w; ++col)
          grid.patch_is_padding[static_cast<size_t>(r * grid.grid_w + col)] = 1;
      check_case_on_grid(model, grid, c, tolerance, name + " padded");
    }
  }
}

TEST_CASE("the rotary embedding is what makes the parity: without it or with the other pairing the maps differ", "[parity][formats]") {
  const nlohmann::json manifest = foreign_manifest();
  for (const char* name : {"timm_dinov3", "timm_eva02"}) {
    INFO(name);
    const vitlens::VitModel model = vitlens::load_model(kForeignDir + std::string(name) + "/model.safetensors");
    const vitlens::PreparedImage image =
        vitlens::prepare_image(vitlens::load_image_rgb(kForeignDir + manifest.at("image").get<std::string>()), model.config, 0);
    vitlens::ForwardOptions options;
    options.keep_probs = true;
    const vitlens::ForwardResult right = vitlens::forward(model, image.grid, options);
    const NpyArray probs = read_npy(kForeignDir + name + "/probs.npy");
    const NpyArray output = read_npy(kForeignDir + name + "/output.npy");
    double dp = 0.0, dout = 0.0;
    worst_differences(right, probs, output, dp, dout);
    CHECK(dp <= 1e-5);
    for (int variant = 0; variant < 2; ++variant) {
      // The model's own weights (views into model.storage) under the other config.
      vitlens::VitModel other;
      other.config = model.config;
      if (variant == 0) other.config.rope = vitlens::Rope::None;
      else other.config.rope_rotate_half = !other.config.rope_rotate_half;
      other.w = model.w;
      other.position_resize = model.position_resize;
      const vitlens::ForwardResult wrong = vitlens::forward(other, image.grid, options);
      worst_differences(wrong, probs, output, dp, dout);
      INFO("variant " << variant);
      CHECK(dp > 0.01);
    }
  }
}

TEST_CASE("rotary and SwiGLU models run in bfloat16 and are refused by training", "[formats]") {
  const nlohmann::json manifest = foreign_manifest();
  const cv::Mat rgb = vitlens::load_image_rgb(kForeignDir + manifest.at("image").get<std::string>());
  for (const char* name : {"timm_dinov3_swiglu", "timm_eva02_base", "hf_dinov3_gated", "timm_rmsnorm"}) {
    INFO(name);
    const vitlens::VitModel model = vitlens::load_model(kForeignDir + std::string(name) + "/model.safetensors");
    const vitlens::PreparedImage image = vitlens::prepare_image(rgb, model.config, 0);
    // The bf16 Linear layers read fc1's packed gate and value rows as the fp32 ones do: the same
    // maps to bfloat16's precision.
    vitlens::ForwardOptions options;
    options.keep_probs = true;
    const vitlens::ForwardResult fp32 = vitlens::forward(model, image.grid, options);
    options.precision = vitlens::Precision::Bf16;
    const vitlens::ForwardResult bf16 = vitlens::forward(model, image.grid, options);
    REQUIRE(bf16.precision == vitlens::Precision::Bf16);
    const vitlens::MatRM& a = fp32.layers.back().probs[0];
    const vitlens::MatRM& b = bf16.layers.back().probs[0];
    const double diff = max_abs_diff(a.data(), b.data(), static_cast<size_t>(a.size()));
    CHECK(diff > 0.0);
    CHECK(diff < 0.05);
    // Training computes none of these options: a run is refused naming the first.
    CHECK_THROWS_WITH(vitlens::train::param_layout(model.config, 3),
                      Catch::Contains("training does not compute") &&
                          (Catch::Contains("rotary") || Catch::Contains("RMSNorm")));
  }
}
