// ViT models from and to safetensors: config JSON in the metadata, timm tensor names.
#include "models/model_io.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

#include "models/model_transform.hpp"
#include "core/base/error.hpp"
#include "core/io/paths.hpp"
#include "core/base/memory.hpp"
#include "core/io/files.hpp"
#include "models/json_file.hpp"
#include "models/published_layouts.hpp"

namespace vitlens {

namespace {

using nlohmann::json;

const json& require_key(const json& j, const char* key, const std::string& what) {
  if (!j.contains(key)) throw Error(what + ": config key '" + key + "' is missing");
  return j.at(key);
}

int get_int(const json& j, const char* key, const std::string& what) {
  const json& v = require_key(j, key, what);
  if (!v.is_number_integer()) throw Error(what + ": config key '" + key + "' must be an integer");
  const auto x = v.get<int64_t>();
  if (x < -1000000000 || x > 1000000000) throw Error(what + ": config key '" + key + "' is out of range");
  return static_cast<int>(x);
}

float get_float(const json& j, const char* key, const std::string& what) {
  const json& v = require_key(j, key, what);
  if (!v.is_number()) throw Error(what + ": config key '" + key + "' must be a number");
  return v.get<float>();
}

double get_double(const json& j, const char* key, const std::string& what) {
  const json& v = require_key(j, key, what);
  if (!v.is_number()) throw Error(what + ": config key '" + key + "' must be a number");
  return v.get<double>();
}

bool get_bool(const json& j, const char* key, const std::string& what) {
  const json& v = require_key(j, key, what);
  if (!v.is_boolean()) throw Error(what + ": config key '" + key + "' must be true or false");
  return v.get<bool>();
}

// Capped as it is read (json_file.hpp): a file's name of megabytes must not reach a caption.
std::string get_string(const json& j, const char* key, size_t limit, const std::string& what) {
  const json& v = require_key(j, key, what);
  if (!v.is_string()) throw Error(what + ": config key '" + key + "' must be a string");
  return capped_text(v.get_ref<const std::string&>(), limit);
}

std::array<float, 3> get_rgb(const json& j, const char* key, const std::string& what) {
  const json& v = require_key(j, key, what);
  if (!v.is_array() || v.size() != 3) throw Error(what + ": config key '" + key + "' must be a list of 3 numbers");
  std::array<float, 3> out{};
  for (size_t c = 0; c < 3; ++c) {
    if (!v[c].is_number()) throw Error(what + ": config key '" + key + "' must be a list of 3 numbers");
    out[c] = v[c].get<float>();
  }
  return out;
}

bool parse_activation(const std::string& name, Activation& act) {
  for (Activation a : {Activation::Gelu, Activation::GeluTanh, Activation::QuickGelu})
    if (name == activation_name(a)) {
      act = a;
      return true;
    }
  return false;
}

bool path_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

// Loading holds the decoded floats and the model's blob at once (the file is read tensor by
// tensor, never whole): twice the file for F32, four times for F16/BF16, whose floats are twice
// their bytes. The header is not read yet, so the check asks for twice the file; a half-precision
// file that passes it and still does not fit ends in the allocation's "out of memory" line. A
// file whose load cannot fit is refused before any of it is read, with the numbers, instead of
// the machine swapping or the process dying.
void check_fits_in_memory(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;  // the read (InputFile) says why
  const double available = static_cast<double>(available_memory_bytes());
  if (available <= 0) return;  // not Linux-like: let the read try
  const double need = 2.0 * static_cast<double>(st.st_size);
  if (need > available) {
    char text[256];
    std::snprintf(text, sizeof text, ": the file is %.1f GiB and loading it needs about %.1f GiB, but only %.1f GiB of memory is available",
                  static_cast<double>(st.st_size) / (1 << 30), need / (1 << 30), available / (1 << 30));
    throw Error(path + text);
  }
}

}  // namespace

VitConfig config_from_json(const json& j, const std::string& what) {
  if (!j.is_object()) throw Error(what + ": config is not a JSON object");
  VitConfig c;
  c.name = get_string(j, "name", kMaxModelNameBytes, what);
  c.description = get_string(j, "description", kMaxModelDescriptionBytes, what);
  c.patch_size = get_int(j, "patch_size", what);
  c.embed_dim = get_int(j, "embed_dim", what);
  c.num_heads = get_int(j, "num_heads", what);
  c.depth = get_int(j, "depth", what);
  const json& img = require_key(j, "img_size", what);
  // Read as 64-bit and range-check before narrowing, so 2^32 + 4 cannot pass as 4.
  auto side = [&](const json& v) {
    const auto x = v.get<int64_t>();
    if (x < 1 || x > 16384) throw Error(what + ": config key 'img_size' has a side " + std::to_string(x) + " outside [1, 16384]");
    return static_cast<int>(x);
  };
  if (img.is_number_integer()) {
    c.img_h = c.img_w = side(img);
  } else if (img.is_array() && img.size() == 2 && img[0].is_number_integer() && img[1].is_number_integer()) {
    c.img_h = side(img[0]);
    c.img_w = side(img[1]);
  } else {
    throw Error(what + ": config key 'img_size' must be [height, width] integers");
  }
  c.class_token = get_bool(j, "class_token", what);
  c.mlp_ratio = get_double(j, "mlp_ratio", what);
  c.norm_eps = get_float(j, "norm_eps", what);
  c.mean = get_rgb(j, "mean", what);
  c.std = get_rgb(j, "std", what);
  c.qkv_bias = get_bool(j, "qkv_bias", what);
  // The architecture options (vit.hpp); absent keys keep the original vitlens block.
  if (j.contains("dist_token")) c.dist_token = get_bool(j, "dist_token", what);
  if (j.contains("register_tokens")) c.register_tokens = get_int(j, "register_tokens", what);
  if (j.contains("pos_embed_prefix")) c.pos_embed_prefix = get_bool(j, "pos_embed_prefix", what);
  if (j.contains("patch_bias")) c.patch_bias = get_bool(j, "patch_bias", what);
  if (j.contains("pre_norm")) c.pre_norm = get_bool(j, "pre_norm", what);
  if (j.contains("layer_scale")) c.layer_scale = get_bool(j, "layer_scale", what);
  if (j.contains("post_norm")) c.post_norm = get_bool(j, "post_norm", what);
  if (j.contains("final_norm")) c.final_norm = get_bool(j, "final_norm", what);
  if (j.contains("attention_pool")) c.attention_pool = get_bool(j, "attention_pool", what);
  if (j.contains("act")) {
    const std::string act = get_string(j, "act", 32, what);
    if (!parse_activation(act, c.act))
      throw Error(what + ": config key 'act' is '" + act + "'; vitlens knows gelu, gelu_tanh and quick_gelu");
  }
  if (j.contains("global_pool")) {
    const std::string pool = get_string(j, "global_pool", 32, what);
    if (!parse_head_pool(pool, c.head_pool))
      throw Error(what + ": config key 'global_pool' is '" + pool + "'; vitlens knows auto, token, avg, max, avgmax and map");
  }
  if (j.contains("pool_include_prefix")) c.pool_include_prefix = get_bool(j, "pool_include_prefix", what);
  if (j.contains("pos_embed")) c.pos_embed = get_bool(j, "pos_embed", what);
  if (j.contains("rope")) {
    const std::string rope = get_string(j, "rope", 32, what);
    bool known = false;
    for (Rope r : {Rope::None, Rope::Dinov3, Rope::Eva})
      if (rope == rope_name(r)) c.rope = r, known = true;
    if (!known) throw Error(what + ": config key 'rope' is '" + rope + "'; vitlens knows none, dinov3 and eva");
  }
  if (j.contains("rope_temperature")) c.rope_temperature = get_float(j, "rope_temperature", what);
  if (j.contains("rope_rotate_half")) c.rope_rotate_half = get_bool(j, "rope_rotate_half", what);
  if (j.contains("rope_grid_offset")) c.rope_grid_offset = get_float(j, "rope_grid_offset", what);
  if (j.contains("rope_ref_grid")) {
    const json& ref = j["rope_ref_grid"];
    if (!ref.is_array() || ref.size() != 2 || !ref[0].is_number_integer() || !ref[1].is_number_integer())
      throw Error(what + ": config key 'rope_ref_grid' must be [rows, cols] integers");
    c.rope_ref_h = static_cast<int>(std::clamp<int64_t>(ref[0].get<int64_t>(), -1, 1 << 20));
    c.rope_ref_w = static_cast<int>(std::clamp<int64_t>(ref[1].get<int64_t>(), -1, 1 << 20));
  }
  if (j.contains("swiglu")) c.swiglu = get_bool(j, "swiglu", what);
  if (j.contains("mlp_norm")) c.mlp_norm = get_bool(j, "mlp_norm", what);
  if (j.contains("rms_norm")) c.rms_norm = get_bool(j, "rms_norm", what);
  if (j.contains("attn_out_norm")) c.attn_out_norm = get_bool(j, "attn_out_norm", what);
  if (j.contains("head_descriptions")) {
    const json& hd = j["head_descriptions"];
    bool ok = hd.is_array();
    if (ok)
      for (const json& layer : hd) {
        if (!layer.is_array()) { ok = false; break; }
        std::vector<std::string> texts;
        for (const json& t : layer) {
          if (!t.is_string()) { ok = false; break; }
          texts.push_back(capped_text(t.get_ref<const std::string&>(), kMaxHeadDescriptionBytes));
        }
        c.head_descriptions.push_back(std::move(texts));
      }
    if (!ok) throw Error(what + ": config key 'head_descriptions' must be a list of lists of strings");
  }
  const std::string why = c.validate();
  if (!why.empty()) throw Error(what + ": inconsistent config: " + why);
  return c;
}

json config_to_json(const VitConfig& c) {
  json j = {{"name", c.name},           {"description", c.description}, {"patch_size", c.patch_size},
            {"embed_dim", c.embed_dim}, {"num_heads", c.num_heads},     {"depth", c.depth},
            {"img_size", {c.img_h, c.img_w}}, {"class_token", c.class_token}, {"mlp_ratio", c.mlp_ratio},
            {"norm_eps", c.norm_eps},   {"mean", c.mean},               {"std", c.std},
            {"qkv_bias", c.qkv_bias}};
  // Options away from the original block only, so the bundled files' metadata stays as it was.
  const VitConfig base;
  if (c.dist_token != base.dist_token) j["dist_token"] = c.dist_token;
  if (c.register_tokens != base.register_tokens) j["register_tokens"] = c.register_tokens;
  if (c.pos_embed_prefix != base.pos_embed_prefix) j["pos_embed_prefix"] = c.pos_embed_prefix;
  if (c.patch_bias != base.patch_bias) j["patch_bias"] = c.patch_bias;
  if (c.pre_norm != base.pre_norm) j["pre_norm"] = c.pre_norm;
  if (c.layer_scale != base.layer_scale) j["layer_scale"] = c.layer_scale;
  if (c.post_norm != base.post_norm) j["post_norm"] = c.post_norm;
  if (c.final_norm != base.final_norm) j["final_norm"] = c.final_norm;
  if (c.attention_pool != base.attention_pool) j["attention_pool"] = c.attention_pool;
  if (c.act != base.act) j["act"] = activation_name(c.act);
  if (c.head_pool != base.head_pool) j["global_pool"] = head_pool_name(c.head_pool);
  if (c.pool_include_prefix != base.pool_include_prefix) j["pool_include_prefix"] = c.pool_include_prefix;
  if (c.pos_embed != base.pos_embed) j["pos_embed"] = c.pos_embed;
  if (c.rope != base.rope) {
    j["rope"] = rope_name(c.rope);
    j["rope_temperature"] = c.rope_temperature;
    j["rope_rotate_half"] = c.rope_rotate_half;
    j["rope_grid_offset"] = c.rope_grid_offset;
    if (c.rope_ref_h > 0) j["rope_ref_grid"] = {c.rope_ref_h, c.rope_ref_w};
  }
  if (c.swiglu != base.swiglu) j["swiglu"] = c.swiglu;
  if (c.mlp_norm != base.mlp_norm) j["mlp_norm"] = c.mlp_norm;
  if (c.rms_norm != base.rms_norm) j["rms_norm"] = c.rms_norm;
  if (c.attn_out_norm != base.attn_out_norm) j["attn_out_norm"] = c.attn_out_norm;
  if (!c.head_descriptions.empty()) j["head_descriptions"] = c.head_descriptions;
  return j;
}

std::map<std::string, std::vector<int64_t>> expected_tensor_shapes(const VitConfig& c) {
  const int64_t d = c.embed_dim, p = c.patch_size, hm = c.mlp_hidden();
  std::map<std::string, std::vector<int64_t>> s;
  s["patch_embed.proj.weight"] = {d, 3, p, p};
  if (c.patch_bias) s["patch_embed.proj.bias"] = {d};
  if (c.class_token) s["cls_token"] = {1, 1, d};
  if (c.dist_token) s["dist_token"] = {1, 1, d};
  if (c.register_tokens) s["reg_token"] = {1, c.register_tokens, d};
  if (c.pos_embed) s["pos_embed"] = {1, c.pos_tokens(), d};
  if (c.pre_norm) {
    s["norm_pre.weight"] = {d};
    s["norm_pre.bias"] = {d};
  }
  for (int i = 0; i < c.depth; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    s[b + "norm1.weight"] = {d};
    s[b + "norm1.bias"] = {d};
    s[b + "attn.qkv.weight"] = {3 * d, d};
    if (c.qkv_bias) s[b + "attn.qkv.bias"] = {3 * d};
    if (c.attn_out_norm) {
      s[b + "attn.norm.weight"] = {d};
      s[b + "attn.norm.bias"] = {d};
    }
    s[b + "attn.proj.weight"] = {d, d};
    s[b + "attn.proj.bias"] = {d};
    s[b + "norm2.weight"] = {d};
    s[b + "norm2.bias"] = {d};
    if (c.layer_scale) {
      s[b + "ls1.gamma"] = {d};
      s[b + "ls2.gamma"] = {d};
    }
    s[b + "mlp.fc1.weight"] = {c.fc1_rows(), d};
    s[b + "mlp.fc1.bias"] = {c.fc1_rows()};
    if (c.mlp_norm) {
      s[b + "mlp.norm.weight"] = {hm};
      s[b + "mlp.norm.bias"] = {hm};
    }
    s[b + "mlp.fc2.weight"] = {d, hm};
    s[b + "mlp.fc2.bias"] = {d};
  }
  if (c.final_norm) {
    s["norm.weight"] = {d};
    s["norm.bias"] = {d};
  }
  if (c.rms_norm)  // timm's RmsNorm has a weight only: no norm_pre, norm1, norm2, mlp.norm or norm bias
    for (auto it = s.begin(); it != s.end();) {
      const std::string& name = it->first;
      const bool norm_bias = name.find("norm") != std::string::npos && name.size() >= 5 &&
                             name.compare(name.size() - 5, 5, ".bias") == 0;
      it = norm_bias ? s.erase(it) : std::next(it);
    }
  if (c.attention_pool) {  // timm's AttentionPoolLatent names
    s["attn_pool.latent"] = {1, 1, d};
    s["attn_pool.q.weight"] = {d, d};
    s["attn_pool.q.bias"] = {d};
    s["attn_pool.kv.weight"] = {2 * d, d};
    s["attn_pool.kv.bias"] = {2 * d};
    s["attn_pool.proj.weight"] = {d, d};
    s["attn_pool.proj.bias"] = {d};
    s["attn_pool.norm.weight"] = {d};
    s["attn_pool.norm.bias"] = {d};
    s["attn_pool.mlp.fc1.weight"] = {hm, d};
    s["attn_pool.mlp.fc1.bias"] = {hm};
    s["attn_pool.mlp.fc2.weight"] = {d, hm};
    s["attn_pool.mlp.fc2.bias"] = {d};
  }
  return s;
}

namespace {

// A pair `<name>.weight` and `<name>.bias` that is optional: both or neither. True when present.
bool optional_pair(const TensorMap& tensors, const std::string& name, const std::string& what) {
  const bool w = tensors.count(name + ".weight") != 0, b = tensors.count(name + ".bias") != 0;
  if (w != b)
    throw Error(what + ": tensor '" + name + (w ? ".weight" : ".bias") + "' is not part of the configured model without '" +
                name + (w ? ".bias" : ".weight") + "': '" + name + ".weight' and '" + name + ".bias' must both be present or both absent");
  return w;
}

// The optional classifier head: its class count (0 without), its shapes added to `shapes`, with
// the optional fc_norm (D) and DeiT's head_dist (C, D) (classifier.hpp).
int check_head(const VitConfig& config, const TensorMap& tensors, std::map<std::string, std::vector<int64_t>>& shapes,
               const std::string& what) {
  const bool fc_norm = optional_pair(tensors, "fc_norm", what);
  const bool head_dist = optional_pair(tensors, "head_dist", what);
  if (!optional_pair(tensors, "head", what)) {
    if (fc_norm || head_dist)
      throw Error(what + ": tensor '" + std::string(fc_norm ? "fc_norm" : "head_dist") +
                  ".weight' is not part of the configured model: it belongs to a classifier 'head.weight' the file does not have");
    return 0;
  }
  const auto head_w = tensors.find("head.weight");
  if (head_w->second.shape.size() != 2 || head_w->second.shape[0] < 1)
    throw Error(what + ": tensor 'head.weight' has shape " + shape_text(head_w->second.shape) + ", expected [classes, " +
                std::to_string(config.embed_dim) + "]");
  const int num_classes = static_cast<int>(head_w->second.shape[0]);
  shapes["head.weight"] = {num_classes, config.embed_dim};
  shapes["head.bias"] = {num_classes};
  if (fc_norm) {
    shapes["fc_norm.weight"] = {config.embed_dim};
    shapes["fc_norm.bias"] = {config.embed_dim};
  }
  if (head_dist) {
    if (!config.dist_token) throw Error(what + ": tensor 'head_dist.weight' is present but the model has no distillation token");
    shapes["head_dist.weight"] = {num_classes, config.embed_dim};
    shapes["head_dist.bias"] = {num_classes};
  }
  return num_classes;
}

// Every tensor the config uses is there with its shape and finite values, and no other is there.
void check_tensors(const VitConfig& config, const TensorMap& tensors, const std::map<std::string, std::vector<int64_t>>& shapes,
                   const std::string& what) {
  if (!config.qkv_bias)
    for (int i = 0; i < config.depth; ++i)
      if (tensors.count("blocks." + std::to_string(i) + ".attn.qkv.bias"))
        throw Error(what + ": tensor 'blocks." + std::to_string(i) + ".attn.qkv.bias' is present but config says qkv_bias false");
  // A tensor the config does not use would be silently ignored: a timm checkpoint with
  // LayerScale (ls1.gamma), qk-norm, register tokens or more blocks than `depth` computes different
  // attention than vitlens would show. Refuse it instead.
  for (const auto& entry : tensors)
    if (!shapes.count(entry.first))
      throw Error(what + ": tensor '" + entry.first + "' is not part of the configured model (" + std::to_string(config.depth) +
                  " block(s), timm VisionTransformer names); vitlens would ignore it");
  for (const auto& [name, shape] : shapes) {
    const auto it = tensors.find(name);
    if (it == tensors.end()) throw Error(what + ": tensor '" + name + "' is missing");
    if (it->second.shape != shape)
      throw Error(what + ": tensor '" + name + "' has shape " + shape_text(it->second.shape) + ", expected " + shape_text(shape));
    for (float v : it->second.values)
      if (!std::isfinite(v)) throw Error(what + ": tensor '" + name + "' holds NaN or infinite values");
  }
}

// The weight views, by timm name, into the blob (nullptr for a tensor the config does not have).
VitWeights weight_views(const VitConfig& config, const std::map<std::string, const float*>& at) {
  auto view = [&](const std::string& name) -> const float* {
    const auto it = at.find(name);
    return it == at.end() ? nullptr : it->second;
  };
  VitWeights w;
  w.patch_w = view("patch_embed.proj.weight");
  w.patch_b = view("patch_embed.proj.bias");
  w.cls_token = view("cls_token");
  w.dist_token = view("dist_token");
  w.reg_tokens = view("reg_token");
  w.pos_embed = view("pos_embed");
  w.norm_pre_w = view("norm_pre.weight");
  w.norm_pre_b = view("norm_pre.bias");
  for (int i = 0; i < config.depth; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    BlockWeights bw;
    bw.norm1_w = view(b + "norm1.weight");
    bw.norm1_b = view(b + "norm1.bias");
    bw.qkv_w = view(b + "attn.qkv.weight");
    bw.qkv_b = view(b + "attn.qkv.bias");
    bw.attn_norm_w = view(b + "attn.norm.weight");
    bw.attn_norm_b = view(b + "attn.norm.bias");
    bw.proj_w = view(b + "attn.proj.weight");
    bw.proj_b = view(b + "attn.proj.bias");
    bw.norm2_w = view(b + "norm2.weight");
    bw.norm2_b = view(b + "norm2.bias");
    bw.ls1 = view(b + "ls1.gamma");
    bw.ls2 = view(b + "ls2.gamma");
    bw.fc1_w = view(b + "mlp.fc1.weight");
    bw.fc1_b = view(b + "mlp.fc1.bias");
    bw.mlp_norm_w = view(b + "mlp.norm.weight");
    bw.mlp_norm_b = view(b + "mlp.norm.bias");
    bw.fc2_w = view(b + "mlp.fc2.weight");
    bw.fc2_b = view(b + "mlp.fc2.bias");
    w.blocks.push_back(bw);
  }
  w.norm_w = view("norm.weight");
  w.norm_b = view("norm.bias");
  w.fc_norm_w = view("fc_norm.weight");
  w.fc_norm_b = view("fc_norm.bias");
  AttentionPoolWeights& pool = w.pool;
  pool.latent = view("attn_pool.latent");
  pool.q_w = view("attn_pool.q.weight");
  pool.q_b = view("attn_pool.q.bias");
  pool.kv_w = view("attn_pool.kv.weight");
  pool.kv_b = view("attn_pool.kv.bias");
  pool.proj_w = view("attn_pool.proj.weight");
  pool.proj_b = view("attn_pool.proj.bias");
  pool.norm_w = view("attn_pool.norm.weight");
  pool.norm_b = view("attn_pool.norm.bias");
  pool.fc1_w = view("attn_pool.mlp.fc1.weight");
  pool.fc1_b = view("attn_pool.mlp.fc1.bias");
  pool.fc2_w = view("attn_pool.mlp.fc2.weight");
  pool.fc2_b = view("attn_pool.mlp.fc2.bias");
  w.head_w = view("head.weight");
  w.head_b = view("head.bias");
  w.head_dist_w = view("head_dist.weight");
  w.head_dist_b = view("head_dist.bias");
  return w;
}

}  // namespace

VitModel model_from_tensors(const VitConfig& config, const TensorMap& tensors, const std::string& what) {
  auto shapes = expected_tensor_shapes(config);
  const int num_classes = check_head(config, tensors, shapes, what);
  check_tensors(config, tensors, shapes, what);
  VitModel model;
  model.config = config;
  model.source = what;
  size_t total = 0;
  for (const auto& entry : shapes) total += tensors.at(entry.first).values.size();
  // One blob; the weight views point into it (the vector never reallocates after this).
  model.storage.reserve(total);
  std::map<std::string, const float*> at;
  for (const auto& entry : shapes) {
    const auto& values = tensors.at(entry.first).values;
    at[entry.first] = model.storage.data() + model.storage.size();
    model.storage.insert(model.storage.end(), values.begin(), values.end());
  }
  model.w = weight_views(config, at);
  model.w.num_classes = num_classes;
  return model;
}

namespace {

// The classifier's labels of a trained vitlens model: the training record's "class_names", when
// there is one name per row of the head (a record that does not match is left unread).
void read_class_names(const std::map<std::string, std::string>& metadata, VitModel& model) {
  const auto it = metadata.find("training");
  if (it == metadata.end() || model.w.num_classes < 1) return;
  json record;
  try {
    record = parse_json_text(it->second, "training record", kMaxModelNameBytes);
  } catch (const Error&) {
    return;  // the record is informational; a model loads without it
  }
  if (!record.is_object() || !record.contains("class_names") || !record["class_names"].is_array()) return;
  const json& names = record["class_names"];
  if (static_cast<int>(names.size()) != model.w.num_classes) return;
  std::vector<std::string> out;
  for (const json& n : names) {
    if (!n.is_string()) return;
    out.push_back(n.get<std::string>());
  }
  model.class_names = std::move(out);
  model.class_names_source = "the training record";
}

VitConfig config_from_metadata(const std::string& text, const std::string& what) {
  return config_from_json(parse_json_text(text, what + ": __metadata__[\"config\"]"), what);
}

// A parsed safetensors file as a model: vitlens' own config in __metadata__, else a foreign
// layout (timm, Hugging Face) converted by published_layouts.cpp, whose companion config.json is looked
// for in `folder` (empty: none, as for bytes that came from no file).
VitModel model_from_file(SafetensorsFile file, const std::string& what, const std::string& folder,
                         const LoadOptions& options) {
  const auto it = file.metadata.find("config");
  if (it == file.metadata.end()) {
    if (folder.empty())
      throw Error(what + ": no vitlens config: __metadata__[\"config\"] is missing (see README, Model files)");
    ConvertedModel converted = convert_checkpoint(std::move(file.tensors), what, folder, options);
    const std::string why = converted.config.validate();
    if (!why.empty()) throw Error(what + ": inconsistent " + converted.format + " model: " + why);
    VitModel model = model_from_tensors(converted.config, converted.tensors, what);
    model.format = converted.format;
    model.notes = std::move(converted.notes);
    model.class_names = std::move(converted.class_names);
    model.class_names_source = std::move(converted.class_names_source);
    model.position_resize = library_position_resize(converted.format, folder);
    return model;
  }
  const VitConfig config = config_from_metadata(it->second, what);
  // --heads is for checkpoints that do not say their head count; this file says it.
  if (options.heads > 0 && options.heads != config.num_heads)
    throw Error(what + ": --heads " + std::to_string(options.heads) + " contradicts the model's config, which has " +
                std::to_string(config.num_heads) + " heads (leave --heads out for a vitlens model file)");
  VitModel model = model_from_tensors(config, file.tensors, what);
  read_class_names(file.metadata, model);
  return model;
}

}  // namespace

VitConfig read_model_config(const std::string& path) {
  const auto metadata = read_safetensors_metadata(path);
  const auto it = metadata.find("config");
  if (it == metadata.end()) throw Error(path + ": no vitlens config: __metadata__[\"config\"] is missing");
  return config_from_metadata(it->second, path);
}

VitModel parse_model(const std::string& bytes, const std::string& what) {
  return model_from_file(parse_safetensors(bytes, what), what, "", LoadOptions{});
}

VitModel load_model(const std::string& path) { return load_model(path, LoadOptions{}); }

VitModel load_model(const std::string& path, const LoadOptions& options) {
  check_fits_in_memory(path);
  return model_from_file(read_safetensors(path), path, parent_dir(path), options);
}

std::string model_file_bytes(const std::string& path, const VitConfig& config, const TensorMap& tensors,
                             const std::map<std::string, std::string>& extra_metadata) {
  const std::string why = config.validate();
  if (!why.empty()) throw Error(path + ": refusing to save an inconsistent config: " + why);
  // Check the tensors the same way a load would, so a file we write always loads.
  (void)model_from_tensors(config, tensors, path);
  SafetensorsFile file;
  file.tensors = tensors;
  file.metadata = extra_metadata;
  file.metadata["config"] = config_to_json(config).dump();
  file.metadata["format"] = "pt";
  return safetensors_bytes(file);
}

void save_model(const std::string& path, const VitConfig& config, const TensorMap& tensors,
                const std::map<std::string, std::string>& extra_metadata) {
  write_file_atomic(path, model_file_bytes(path, config, tensors, extra_metadata));
}

std::string assets_dir() {
  if (const char* env = std::getenv("VITLENS_ASSETS"); env && *env) return env;
  // Beside the executable first, so an installed vitlens (bin/ and share/vitlens/ under one
  // prefix, wherever the prefix is moved) uses its own assets from any working directory, even
  // when the source tree it was built from is still there.
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.find_last_of('/'));
    for (const std::string& rel : {std::string("/") + VITLENS_INSTALL_DATA_FROM_BIN, std::string("/assets")})
      if (path_exists(dir + rel + "/models")) return std::filesystem::path(dir + rel).lexically_normal().string();
  }
  // A binary in the build tree: the source tree's assets (compiled in).
#ifdef VITLENS_SOURCE_ASSETS
  if (path_exists(VITLENS_SOURCE_ASSETS)) return VITLENS_SOURCE_ASSETS;
#endif
  return "assets";
}

std::string default_model_path() { return assets_dir() + "/models/vitlens-designed.safetensors"; }
std::string random_model_path() { return assets_dir() + "/models/vitlens-random.safetensors"; }
std::string default_image_path() { return assets_dir() + "/images/vitlens-demo.png"; }

}  // namespace vitlens
