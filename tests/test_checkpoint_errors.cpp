// Checkpoints that vitlens must refuse with one clear line, and the timm layout without its
// config.json: copies of the foreign fixtures (tests/fixtures/foreign), edited one fault at a time.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "process_support.hpp"
#include "test_support.hpp"
#include "models/published_layouts.hpp"
#include "core/base/error.hpp"
#include "core/io/image.hpp"
#include "models/model_io.hpp"
#include "models/safetensors.hpp"

using Catch::Contains;
using nlohmann::json;

namespace {

const std::string kForeign = std::string(VITLENS_TEST_FIXTURES) + "/foreign/";

using vitlens::test::slurp;
using vitlens::test::spit;

// A copy of fixture `name` in a fresh folder: model.safetensors and, unless dropped, config.json.
std::string copy_case(const std::string& name, bool with_config = true) {
  const std::string dir = vitlens::test::temp_dir("ckpt");
  spit(dir + "/model.safetensors", slurp(kForeign + name + "/model.safetensors"));
  if (with_config) spit(dir + "/config.json", slurp(kForeign + name + "/config.json"));
  return dir;
}

json read_config(const std::string& dir) { return json::parse(slurp(dir + "/config.json")); }
void write_config(const std::string& dir, const json& j) { spit(dir + "/config.json", j.dump()); }

// The message of the error load_model throws, or "" when it loads.
std::string load_error(const std::string& path, int heads = 0) {
  vitlens::LoadOptions options;
  options.heads = heads;
  try {
    (void)vitlens::load_model(path, options);
  } catch (const vitlens::Error& e) {
    const std::string what = e.what();
    CHECK(what.find('\n') == std::string::npos);  // one line
    CHECK_THAT(what, Contains(path));             // naming the file
    return what;
  }
  return "";
}

// The error load_model gives for a copy of fixture `name` whose config.json `edit` changed.
std::string error_with_config(const std::string& name, const std::function<void(json&)>& edit) {
  const std::string dir = copy_case(name);
  json j = read_config(dir);
  edit(j);
  write_config(dir, j);
  return load_error(dir + "/model.safetensors");
}

}  // namespace

TEST_CASE("a config.json that contradicts the tensors is one line", "[formats][errors]") {
  CHECK_THAT(error_with_config("timm_vit", [](json& j) { j["model_args"]["embed_dim"] = 32; }),
             Contains("model_args.embed_dim is 32") && Contains("says 24"));
  CHECK_THAT(error_with_config("timm_vit", [](json& j) { j["num_classes"] = 1000; }),
             Contains("num_classes is 1000") && Contains("head.weight has 5 rows"));
  CHECK_THAT(error_with_config("timm_vit", [](json& j) { j["model_args"]["img_size"] = {32, 32}; }),  // what timm builds the model at
             Contains("64 patches") && Contains("pos_embed has 17 rows"));
  CHECK_THAT(error_with_config("hf_vit", [](json& j) { j["num_hidden_layers"] = 3; }),
             Contains("num_hidden_layers 3") && Contains("2 blocks"));
  CHECK_THAT(error_with_config("hf_clip", [](json& j) { j["hidden_size"] = 30; j["num_attention_heads"] = 3; }),
             Contains("hidden_size 30"));
  // A width of 0 has no MLP ratio (int(0 * r) is never the MLP's width): one line, not a search
  // that never ends.
  for (const char* family : {"hf_vit", "hf_clip", "hf_siglip", "hf_dinov2"})
    CHECK_THAT(error_with_config(family, [](json& j) { j["hidden_size"] = 0; }), Contains("embed_dim 0") && Contains("(embed_dim is hidden_size)"));
  {
    const std::string dir = copy_case("timm_vit");
    spit(dir + "/config.json", "{\"architecture\": ");
    CHECK_THAT(load_error(dir + "/model.safetensors"), Contains("config.json is not valid JSON"));
  }
}

TEST_CASE("unsupported families are refused, saying which and why", "[formats][errors]") {
  // EVA-02 opens (test_foreign_parity.cpp), but not a plain ViT's tensors under its name.
  CHECK_THAT(error_with_config("timm_vit", [](json& j) { j["architecture"] = "eva02_small_patch14_224.mim_in22k"; }),
             Contains("eva02_small_patch14_224") && Contains("VisionTransformer's"));
  CHECK_THAT(error_with_config("timm_vit", [](json& j) { j["architecture"] = "eva_giant_patch14_224.clip_ft_in1k"; }),
             Contains("unsupported model") && Contains("eva_giant_patch14_224"));
  CHECK_THAT(error_with_config("hf_vit", [](json& j) { j["model_type"] = "beit"; }),
             Contains("model_type 'beit'"));
  CHECK_THAT(error_with_config("hf_dinov2", [](json& j) { j["use_swiglu_ffn"] = true; }),
             Contains("SwiGLU"));
  // A ratio whose MLP width is past any int: refused before the width is computed.
  CHECK_THAT(error_with_config("hf_dinov2", [](json& j) { j["use_swiglu_ffn"] = true; j["mlp_ratio"] = 1e12; }),
             Contains("mlp_ratio 1000000000000.0 is not in (0, 64]"));
  {  // timm qk-norm: a tensor vitlens' block has no place for
    const std::string dir = copy_case("timm_vit");
    vitlens::SafetensorsFile f = vitlens::read_safetensors(dir + "/model.safetensors");
    vitlens::TensorData norm;
    norm.shape = {8};
    norm.values.assign(8, 1.0f);
    f.tensors["blocks.0.attn.q_norm.weight"] = norm;
    vitlens::write_safetensors(dir + "/model.safetensors", f);
    CHECK_THAT(load_error(dir + "/model.safetensors"), Contains("qk-norm") && Contains("blocks.0.attn.q_norm.weight"));
  }
  {  // a safetensors file of something else entirely
    const std::string dir = vitlens::test::temp_dir("ckpt");
    vitlens::SafetensorsFile f;
    vitlens::TensorData t;
    t.shape = {2};
    t.values = {1.0f, 2.0f};
    f.tensors["conv1.weight"] = t;
    vitlens::write_safetensors(dir + "/model.safetensors", f);
    CHECK_THAT(load_error(dir + "/model.safetensors"), Contains("'conv1.weight'") && Contains("match neither"));
  }
}

TEST_CASE("models the real libraries made are refused naming the feature, with or without config.json", "[formats][errors]") {
  // tests/fixtures/make_foreign_fixtures.py, refused/: each saved by timm or transformers.
  struct Refused {
    const char* name;
    const char* with_config;     // in the message when config.json is beside the file
    const char* without_config;  // when only the tensors speak; nullptr: the file needs its config
  };
  const Refused refused[] = {
      {"timm_relpos", "relative position biases", "relative position biases"},
      {"timm_parallel", "ParallelThingsBlock", "ParallelThingsBlock"},
      {"hf_timm_wrapper", "TimmWrapper", "TimmWrapper"},
      {"hf_siglip2", "variable-resolution", nullptr},
      // DINOv3, DINOv2 giant's SwiGLU and RMSNorm, refused here before, are parity cases now
      // (test_foreign_parity.cpp); these two Eva relatives still are not.
      {"timm_vit_rope", "rotary position embeddings (vit_*_rope_*)", "its positions are rotary"},
      {"timm_eva02_enormous", "Eva's residual post-norm blocks", "timm Eva blocks"},
  };
  const json manifest = json::parse(slurp(kForeign + "manifest.json"));
  REQUIRE(manifest.at("refused").size() == std::size(refused));
  for (const Refused& r : refused) {
    INFO(r.name);
    const std::string folder = std::string("refused/") + r.name;
    CHECK_THAT(load_error(kForeign + folder + "/model.safetensors"), Contains("unsupported model") && Contains(r.with_config));
    const std::string bare = copy_case(folder, false);
    if (r.without_config)
      CHECK_THAT(load_error(bare + "/model.safetensors", 3), Contains("unsupported model") && Contains(r.without_config));
    else
      CHECK_THAT(load_error(bare + "/model.safetensors", 3), Contains("needs its config.json beside it"));
  }
}

TEST_CASE("attention pools vitlens does not compute are refused naming the feature", "[formats][errors][pool]") {
  auto edited = [](const std::function<void(vitlens::SafetensorsFile&)>& edit) {
    const std::string dir = copy_case("timm_siglip_map");
    vitlens::SafetensorsFile f = vitlens::read_safetensors(dir + "/model.safetensors");
    edit(f);
    vitlens::write_safetensors(dir + "/model.safetensors", f);
    return load_error(dir + "/model.safetensors");
  };
  CHECK_THAT(edited([](vitlens::SafetensorsFile& f) {
               vitlens::TensorData& latent = f.tensors.at("attn_pool.latent");
               latent.shape = {1, 2, 24};
               latent.values.resize(48, 0.5f);
             }),
             Contains("unsupported model") && Contains("2 latent queries"));
  CHECK_THAT(edited([](vitlens::SafetensorsFile& f) {
               vitlens::TensorData norm;
               norm.shape = {8};
               norm.values.assign(8, 1.0f);
               f.tensors["attn_pool.q_norm.weight"] = norm;
             }),
             Contains("unsupported model") && Contains("qk-norm in the attention pool"));
  CHECK_THAT(edited([](vitlens::SafetensorsFile& f) {
               f.tensors.erase("attn_pool.q.weight");
               f.tensors.erase("attn_pool.q.bias");
             }),
             Contains("unsupported model") && Contains("q_proj=False"));
  CHECK_THAT(edited([](vitlens::SafetensorsFile& f) {
               for (const char* part : {"proj", "norm", "mlp.fc1", "mlp.fc2"})
                 for (const char* kind : {".weight", ".bias"}) f.tensors.erase(std::string("attn_pool.") + part + kind);
             }),
             Contains("unsupported model") && Contains("out_features=0"));
  CHECK_THAT(error_with_config("timm_siglip_map", [](json& j) { j["model_args"]["pool_include_prefix"] = true; }),
             Contains("unsupported model") && Contains("pool_include_prefix"));
  CHECK_THAT(error_with_config("timm_siglip_map", [](json& j) { j["model_args"]["attn_pool_num_heads"] = 1; }),
             Contains("unsupported model") && Contains("attn_pool_num_heads 1"));
  CHECK(error_with_config("timm_siglip_map", [](json& j) { j["model_args"]["attn_pool_num_heads"] = 3; }).empty());

  // timm's Eva (EVA-02 here) with global_pool 'map' pools the prefix tokens too: refused. The pool's
  // tensors are SigLIP's (the same width, 24), moved onto the EVA-02 fixture.
  const vitlens::SafetensorsFile siglip = vitlens::read_safetensors(kForeign + "timm_siglip_map/model.safetensors");
  const std::string eva = copy_case("timm_eva02");
  vitlens::SafetensorsFile f = vitlens::read_safetensors(eva + "/model.safetensors");
  int moved = 0;
  for (const auto& [name, tensor] : siglip.tensors)
    if (name.rfind("attn_pool.", 0) == 0) f.tensors[name] = tensor, ++moved;
  REQUIRE(moved >= 8);
  vitlens::write_safetensors(eva + "/model.safetensors", f);
  json j = read_config(eva);
  j["global_pool"] = "map", j["model_args"]["global_pool"] = "map";
  write_config(eva, j);
  CHECK_THAT(load_error(eva + "/model.safetensors"), Contains("unsupported model") && Contains("attention pool on timm Eva blocks"));
}

TEST_CASE("norms without bias are RMSNorm only when config.json says so", "[formats][errors]") {
  // timm_rmsnorm opens with its config.json (test_foreign_parity.cpp); alone, or with a config that
  // does not name 'rmsnorm', norms without bias could be a LayerNorm without bias: refused.
  CHECK(load_error(kForeign + "timm_rmsnorm/model.safetensors").empty());
  const std::string bare = copy_case("timm_rmsnorm", false);
  CHECK_THAT(load_error(bare + "/model.safetensors", 3), Contains("unsupported model") && Contains("RMSNorm"));
  const std::string unsaid = copy_case("timm_rmsnorm");
  json cfg = read_config(unsaid);
  cfg["model_args"].erase("norm_layer");
  write_config(unsaid, cfg);
  CHECK_THAT(load_error(unsaid + "/model.safetensors"), Contains("RMSNorm") && Contains("model_args.norm_layer"));
  const std::string layernorm = copy_case("timm_vit");
  cfg = read_config(layernorm);
  cfg["model_args"]["norm_layer"] = "rmsnorm";
  write_config(layernorm, cfg);
  CHECK_THAT(load_error(layernorm + "/model.safetensors"), Contains("norm_layer is 'rmsnorm' but blocks.0.norm1.bias is there"));
}

TEST_CASE("a NaN in a Hugging Face file is named as the file names it", "[formats][errors]") {
  const std::string dir = copy_case("hf_vit");
  vitlens::SafetensorsFile f = vitlens::read_safetensors(dir + "/model.safetensors");
  const std::string name = "encoder.layer.1.attention.attention.key.weight";
  REQUIRE(f.tensors.count(name));
  f.tensors[name].values[3] = std::nanf("");
  vitlens::write_safetensors(dir + "/model.safetensors", f);
  CHECK_THAT(load_error(dir + "/model.safetensors"), Contains("'" + name + "' holds NaN"));
}

TEST_CASE("a missing companion file, NaN weights and a model larger than memory are one line", "[formats][errors]") {
  {
    const std::string dir = copy_case("hf_dinov2", false);
    CHECK_THAT(load_error(dir + "/model.safetensors"), Contains("config.json beside it"));
  }
  for (const char* name : {"timm_vit", "hf_clip"}) {
    INFO(name);
    const std::string dir = copy_case(name);
    vitlens::SafetensorsFile f = vitlens::read_safetensors(dir + "/model.safetensors");
    auto& t = f.tensors.begin()->second;
    t.values[t.values.size() / 2] = std::nanf("");
    vitlens::write_safetensors(dir + "/model.safetensors", f);
    CHECK_THAT(load_error(dir + "/model.safetensors"), Contains("NaN or infinite"));
  }
  {  // 1 TiB, sparse: refused from its size before any of it is read
    const std::string dir = vitlens::test::temp_dir("ckpt");
    const std::string path = dir + "/model.safetensors";
    const std::string header = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    spit(path, bytes + header);
    const int fd = ::open(path.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(1) << 40) == 0);
    ::close(fd);
    CHECK_THAT(load_error(path), Contains("1024.0 GiB") && Contains("memory is available"));
  }
}

TEST_CASE("timm layout without config.json: inferred from the tensors, heads from --heads", "[formats]") {
  const std::string dir = copy_case("timm_vit", false);
  const std::string path = dir + "/model.safetensors";
  CHECK_THAT(load_error(path), Contains("pass --heads") && Contains("no config.json"));

  vitlens::LoadOptions options;
  options.heads = 3;
  const vitlens::VitModel bare = vitlens::load_model(path, options);
  const vitlens::VitModel full = vitlens::load_model(kForeign + "timm_vit/model.safetensors");
  CHECK(bare.config.num_heads == 3);
  CHECK(bare.config.patch_size == 4);
  CHECK(bare.config.embed_dim == 24);
  CHECK(bare.config.depth == 2);
  CHECK(bare.config.img_h == 16);
  bool said_heads = false, said_size = false;
  for (const std::string& note : bare.notes) {
    said_heads |= note.find("--heads") != std::string::npos;
    said_size |= note.find("from pos_embed") != std::string::npos;
  }
  CHECK(said_heads);
  CHECK(said_size);
  // The same weights and options (vit_small_patch16_224's mean/std is 0.5, the assumed one): the
  // same numbers as the load with config.json.
  const cv::Mat rgb = vitlens::load_image_rgb(kForeign + "image.png");
  const auto a = vitlens::forward(bare, vitlens::prepare_image(rgb, bare.config, 0).grid, {});
  const auto b = vitlens::forward(full, vitlens::prepare_image(rgb, full.config, 0).grid, {});
  CHECK(a.output == b.output);

  // --heads against a config that says otherwise.
  CHECK_THAT(load_error(kForeign + "timm_vit/model.safetensors", 4), Contains("--heads 4 contradicts"));
  CHECK_THAT(load_error(kForeign + "hf_vit/model.safetensors", 4), Contains("--heads 4 contradicts"));
}

TEST_CASE("the architecture table fills what tensors cannot say", "[formats]") {
  vitlens::VitConfig c;
  bool heads = false;
  vitlens::timm_architecture_options("vit_small_patch16_224.dino", 384, c, heads, "x");
  CHECK(heads);
  CHECK(c.num_heads == 6);
  heads = false;
  vitlens::timm_architecture_options("vit_base_patch16_clip_quickgelu_224.openai", 768, c, heads, "x");
  CHECK(heads);
  CHECK(c.num_heads == 12);
  CHECK(c.act == vitlens::Activation::QuickGelu);
  CHECK(c.norm_eps == Approx(1e-5f));
  vitlens::VitConfig g;
  heads = false;
  vitlens::timm_architecture_options("vit_giant_patch14_dinov2.lvd142m", 1536, g, heads, "x");
  CHECK(g.num_heads == 24);
  heads = false;
  vitlens::timm_architecture_options("vit_small_patch16_224", 48, g, heads, "x");  // a width the name does not have
  CHECK_FALSE(heads);
  CHECK_THROWS_WITH(vitlens::timm_architecture_options("swin_tiny_patch4_window7_224", 96, g, heads, "m"),
                    Contains("not a VisionTransformer family"));
  // Options the entrypoint sets without changing a tensor name.
  vitlens::VitConfig rpn;
  vitlens::timm_architecture_options("vit_base_patch16_rpn_224.sw_in1k", 768, rpn, heads, "x");
  CHECK(rpn.post_norm);
  for (const char* siglip2 : {"vit_so400m_patch16_siglip_gap_384.v2_webli", "vit_base_patch32_siglip_256.v2_webli"}) {
    vitlens::VitConfig s2;
    vitlens::timm_architecture_options(siglip2, 768, s2, heads, "x");
    CHECK(s2.act == vitlens::Activation::GeluTanh);
  }
  vitlens::VitConfig s1;
  vitlens::timm_architecture_options("vit_base_patch16_siglip_gap_224.webli", 768, s1, heads, "x");
  CHECK(s1.act == vitlens::Activation::Gelu);
  CHECK_FALSE(s1.post_norm);
  // DINOv3 (refused by name before) and EVA-02: the rotary embeddings their entrypoints set.
  vitlens::VitConfig d3;
  vitlens::timm_architecture_options("vit_huge_plus_patch16_dinov3.lvd1689m", 1280, d3, heads, "x");
  CHECK(d3.rope == vitlens::Rope::Dinov3);
  CHECK(d3.rope_rotate_half);
  CHECK(d3.rope_temperature == 100.0f);
  CHECK(d3.norm_eps == 1e-5f);
  CHECK(d3.num_heads == 20);  // not the 16 of the other "_huge_" widths
  vitlens::VitConfig e2;
  vitlens::timm_architecture_options("eva02_base_patch14_448.mim_in22k_ft_in22k_in1k", 768, e2, heads, "x");
  CHECK(e2.rope == vitlens::Rope::Eva);
  CHECK_FALSE(e2.rope_rotate_half);
  CHECK(e2.rope_ref_h == 16);
  CHECK(e2.num_heads == 12);
  // Families refused by name, saying why.
  const std::pair<const char*, const char*> by_name[] = {
      {"vit_base_patch16_rope_224.naver_in1k", "rotary"},
      {"eva02_enormous_patch14_clip_224.laion2b", "post-norm"},
      {"vit_relpos_base_patch16_224.sw_in1k", "relative position"},
      {"vit_small_patch16_18x2_224", "parallel blocks"},
      {"vit_dwee_patch16_reg1_gap_256", "differential attention"},
  };
  for (const auto& [arch, why] : by_name)
    CHECK_THROWS_WITH(vitlens::timm_architecture_options(arch, 768, g, heads, "m"), Contains("unsupported model") && Contains(why));
}
