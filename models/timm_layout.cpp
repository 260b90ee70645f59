// timm's hub layout (model.safetensors + config.json as timm saves them) onto vitlens' block:
// tensor names that mean a feature vitlens lacks are refused by name, the options the tensors fix,
// config.json's model_args checked against them, the image size as timm builds the model, and
// timm_architecture_options: what an architecture name sets without changing a tensor name.
#include "models/layout_support.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "models/json_file.hpp"

namespace vitlens {

namespace {

using namespace layout_support;

// [SECTION] timm

// timm's Eva (eva.py: DINOv3, EVA-02) names the block's parts its own way; mapped onto the
// VisionTransformer names vitlens reads, as a checkpoint filter would: gamma_1 / gamma_2 are
// LayerScale; the q and v biases (q_bias, v_bias, or q_proj / v_proj with a k_proj without bias)
// become one qkv bias with a zero key part, as EvaAttention concatenates them with its zero k_bias;
// separate q/k/v projections are stacked; SwiGLU's fc1_g and fc1_x are stacked into one fc1 with
// rows [gate | value]. True when any Eva name was there.
bool eva_to_vit_names(Tensors& t) {
  bool eva = false;
  for (int i = 0; t.has("blocks." + std::to_string(i) + ".norm1.weight"); ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    for (const auto& [from, to] : {std::pair<const char*, const char*>{"gamma_1", "ls1.gamma"}, {"gamma_2", "ls2.gamma"}})
      if (t.has(b + from)) {
        t.map[b + to] = t.take(b + from);
        eva = true;
      }
    // A zero key bias as long as the query bias (EvaAttention's k_bias buffer, never saved).
    auto zero_like = [](const TensorData& like) {
      TensorData z;
      z.shape = like.shape;
      z.values.assign(like.values.size(), 0.0f);
      return z;
    };
    if (t.has(b + "attn.q_bias") || t.has(b + "attn.v_bias")) {
      TensorData q = t.take(b + "attn.q_bias"), v = t.take(b + "attn.v_bias");
      t.map[b + "attn.qkv.bias"] = stack_rows({q, zero_like(q), v});
      eva = true;
    }
    if (t.has(b + "attn.q_proj.weight")) {
      std::vector<TensorData> w;
      for (const char* part : {"q_proj", "k_proj", "v_proj"}) w.push_back(t.take(b + "attn." + part + ".weight"));
      t.map[b + "attn.qkv.weight"] = stack_rows(w);
      if (t.has(b + "attn.q_proj.bias") || t.has(b + "attn.v_proj.bias")) {
        TensorData q = t.take(b + "attn.q_proj.bias"), v = t.take(b + "attn.v_proj.bias");
        TensorData k = t.has(b + "attn.k_proj.bias") ? t.take(b + "attn.k_proj.bias") : zero_like(q);
        t.map[b + "attn.qkv.bias"] = stack_rows({q, k, v});
      }
      eva = true;
    }
    if (t.has(b + "mlp.fc1_g.weight")) {
      t.map[b + "mlp.fc1.weight"] = stack_rows({t.take(b + "mlp.fc1_g.weight"), t.take(b + "mlp.fc1_x.weight")});
      if (t.has(b + "mlp.fc1_g.bias"))
        t.map[b + "mlp.fc1.bias"] = stack_rows({t.take(b + "mlp.fc1_g.bias"), t.take(b + "mlp.fc1_x.bias")});
      eva = true;
    }
  }
  return eva;
}

// Tensor names that mean a feature vitlens' block does not compute.
void refuse_timm_features(const Tensors& t) {
  static const std::pair<const char*, const char*> kRefused[] = {
      {".attn.q_norm.", "qk-norm (a LayerNorm on each head's queries and keys)"},
      {".attn.k_norm.", "qk-norm (a LayerNorm on each head's queries and keys)"},
      {".attn.lambda_q1", "differential attention (timm's DiffAttention)"},
      {".mlp.w12.", "a SwiGLU MLP in xformers' layout (w12, w3)"},
      {"relative_position", "relative position biases"},
      {"rel_pos.", "relative position biases (timm's vit_relpos_* / vit_srelpos_*)"},
      {"rope", "rotary position embeddings"},
      {".in_proj.", "parallel attention and MLP blocks"},
      {".attns.", "parallel attention and MLP branches (timm's ParallelThingsBlock, vit_*_18x2_*)"},
      {"patch_embed.backbone.", "a hybrid CNN stem"},
      {"patch_embed.norm.", "a norm in the patch embedding"},
      {".attn.gate.", "gated attention"},
      {"attn_pool.q_norm.", "qk-norm in the attention pool (timm AttentionPoolLatent qk_norm=True)"},
      {"attn_pool.k_norm.", "qk-norm in the attention pool (timm AttentionPoolLatent qk_norm=True)"},
      {"attn_pool.pos_embed", "a position table of the attention pool's own (timm AttentionPoolLatent pos_embed='abs')"},
      {"attn_pool.pre_norm.", "a parameter-free attention pool (timm global_pool 'prr')"},
      {"attn_pool.post_norm.", "a parameter-free attention pool (timm global_pool 'prr')"},
  };
  for (const auto& entry : t.map)
    for (const auto& [part, why] : kRefused)
      if (contains(entry.first, part))
        throw Error(t.what + ": unsupported model: tensor '" + entry.first + "' means " + why +
                    ", which vitlens' ViT block does not compute (see README, Supported models)");
}

// config.json as timm's save_for_hf writes it; empty objects when there is none.
struct TimmConfig {
  bool present = false;
  json cfg = json::object();
  json args = json::object();  // model_args: the arguments the model was built with
  json pre = json::object();   // pretrained_cfg: how the weights were trained (input_size, mean, std)
  std::string arch;            // "architecture", e.g. "vit_small_patch16_224.dino"; "" without
};

TimmConfig read_timm_config(const std::string& folder, const std::string& what) {
  TimmConfig tc;
  const std::string path = folder + "/config.json";
  tc.present = is_file(path);
  if (!tc.present) return tc;
  tc.cfg = read_json(path, what);
  if (tc.cfg.contains("model_args") && tc.cfg["model_args"].is_object()) tc.args = tc.cfg["model_args"];
  if (tc.cfg.contains("pretrained_cfg") && tc.cfg["pretrained_cfg"].is_object()) tc.pre = tc.cfg["pretrained_cfg"];
  if (tc.cfg.contains("architecture") && tc.cfg["architecture"].is_string()) tc.arch = tc.cfg["architecture"].get<std::string>();
  return tc;
}

// The shapes the tensors fix, and the features their shapes (not their names) show.
void timm_options_from_tensors(Tensors& t, ConvertedModel& m) {
  const std::string& what = t.what;
  VitConfig& c = m.config;
  read_patch_embed(t.peek("patch_embed.proj.weight"), "patch_embed.proj.weight", what, c.embed_dim, c.patch_size);
  const int dim = c.embed_dim;
  c.depth = 0;
  while (t.has("blocks." + std::to_string(c.depth) + ".norm1.weight")) ++c.depth;
  if (c.depth == 0) throw Error(what + ": timm layout without 'blocks.0.norm1.weight': no transformer blocks found");
  auto refuse = [&](const std::string& why) {
    throw Error(what + ": unsupported model: " + why + ", which vitlens' ViT block does not compute (see README, Supported models)");
  };
  c.rms_norm = !t.has("blocks.0.norm1.bias");  // confirmed by model_args.norm_layer in timm_norm_layer
  if (!t.has("blocks.0.attn.proj.bias")) refuse("blocks.0.attn.proj has no bias (timm proj_bias=False)");
  const std::vector<int64_t>& fc1 = t.peek("blocks.0.mlp.fc1.weight").shape;
  const std::vector<int64_t>& fc2 = t.peek("blocks.0.mlp.fc2.weight").shape;
  if (fc1.size() != 2 || fc2.size() != 2)
    throw Error(what + ": tensors 'blocks.0.mlp.fc1.weight' " + shape_text(fc1) + " and 'blocks.0.mlp.fc2.weight' " +
                shape_text(fc2) + " are not matrices");
  // fc1 twice as wide as fc2 reads: a gated MLP, silu(first half) * second half (timm SwiGLUPacked /
  // GluMlp with gate_last=False, DINOv2 giant and EVA-02 S/T; or Eva's fc1_g / fc1_x stacked above).
  c.swiglu = fc1[0] == 2 * fc2[1];
  c.mlp_norm = t.has("blocks.0.mlp.norm.weight");
  c.attn_out_norm = t.has("blocks.0.attn.norm.weight");
  c.pos_embed = t.has("pos_embed");
  c.class_token = t.has("cls_token");
  c.dist_token = t.has("dist_token");
  if (t.has("reg_token")) {
    const TensorData& reg = t.peek("reg_token");
    if (reg.shape.size() != 3 || reg.shape[0] != 1 || reg.shape[2] != dim)
      throw Error(what + ": tensor 'reg_token' has shape " + shape_text(reg.shape) + ", expected [1, R, " + std::to_string(dim) + "]");
    c.register_tokens = static_cast<int>(reg.shape[1]);
  }
  c.patch_bias = t.has("patch_embed.proj.bias");
  c.pre_norm = t.has("norm_pre.weight");
  c.layer_scale = t.has("blocks.0.ls1.gamma");
  c.qkv_bias = t.has("blocks.0.attn.qkv.bias");
  c.final_norm = t.has("norm.weight");
  // fc_norm norms the pooled vector only: kept for the classifier (timm_head), the tokens shown as
  // they leave the last block.
  c.mlp_ratio = mlp_ratio_for(dim, static_cast<int>(fc2[1]));
  c.attention_pool = t.has("attn_pool.latent");
  if (c.attention_pool) {  // timm global_pool 'map' (AttentionPoolLatent): one latent query, q, kv, proj, norm, mlp
    const std::vector<int64_t>& latent = t.peek("attn_pool.latent").shape;
    if (latent.size() == 3 && latent[1] != 1)
      refuse("attn_pool.latent holds " + std::to_string(latent[1]) + " latent queries (timm latent_len > 1)");
    if (!t.has("attn_pool.q.weight")) refuse("its attention pool has no q Linear: the latent is the query (timm q_proj=False)");
    if (!t.has("attn_pool.mlp.fc1.weight"))
      refuse("its attention pool has no proj, norm and MLP (timm AttentionPoolLatent out_features=0)");
  }
  c.norm_eps = 1e-6f;  // timm's VisionTransformer default (partial(nn.LayerNorm, eps=1e-6))
}

// model_args keys the tensors answer: each must agree with them.
void check_args_against_tensors(const json& args, const VitConfig& c, const std::string& what) {
  static const std::pair<const char*, const char*> kFromTensors[] = {
      {"embed_dim", "patch_embed.proj.weight"}, {"patch_size", "patch_embed.proj.weight"},
      {"depth", "the blocks.* tensors"},        {"reg_tokens", "reg_token"},
      {"class_token", "cls_token"},             {"qkv_bias", "blocks.0.attn.qkv.bias"},
      {"pre_norm", "norm_pre.weight"},
  };
  const json said = {{"embed_dim", c.embed_dim},     {"patch_size", c.patch_size},   {"depth", c.depth},
                     {"reg_tokens", c.register_tokens}, {"class_token", c.class_token}, {"qkv_bias", c.qkv_bias},
                     {"pre_norm", c.pre_norm}};
  for (const auto& [key, from] : kFromTensors) {
    if (!args.contains(key)) continue;
    const json& v = args[key];
    const bool same_kind = said[key].is_boolean() ? v.is_boolean() : v.is_number_integer();
    if (!same_kind || v != said[key])
      throw Error(what + ": config.json model_args." + key + " is " + v.dump() + " but " + from + " says " + said[key].dump());
  }
}

// model_args that change the computation without changing the tensor names: refused unless they
// hold timm's standard block's value (null is the default too).
void refuse_timm_args(const json& args, const std::string& what) {
  static const struct { const char* key; const char* standard; const char* means; } kArgs[] = {
      {"qk_norm", "false", "qk-norm (a LayerNorm on each head's queries and keys)"},
      {"attn_type", "\"eva\"", "timm's AttentionRope block"},
      {"use_post_norm", "false", "Eva's residual post-norm blocks"},
      {"num_kv_heads", "null", "grouped-query attention"},
      {"attn_only_layer_scale", "false", "LayerScale on the attention branch only"},
      {"gated_attn", "false", "gated attention"},
      {"rope_grid_indexing", "\"ij\"", "rotary coordinates in 'xy' order"},
      {"proj_bias", "true", "Linear layers without bias"},
      {"pos_embed", "\"learn\"", "no learned position table"},
      {"norm_layer", "\"layernorm\"", "a norm other than LayerNorm (e.g. RMSNorm)"},
      {"embed_norm_layer", "null", "a norm in the patch embedding"},
      {"mlp_layer", "null", "a replaced MLP (e.g. SwiGLU)"},
      {"block_fn", "null", "a replaced block"},
      {"attn_layer", "null", "a replaced attention layer"},
      {"embed_layer", "null", "a replaced patch embedding"},
  };
  for (const auto& rule : kArgs) {
    if (!args.contains(rule.key) || args[rule.key].is_null() || args[rule.key] == json::parse(rule.standard)) continue;
    if (std::string(rule.key) == "norm_layer" && args[rule.key] == "rmsnorm") continue;  // timm_norm_layer
    throw Error(what + ": unsupported model: config.json model_args." + rule.key + " = " + args[rule.key].dump() + " means " +
                rule.means + ", which vitlens' ViT block does not compute");
  }
}

// LayerNorm or timm's RmsNorm: norms without bias are an RMSNorm only when model_args.norm_layer
// says 'rmsnorm' (a LayerNorm without bias would be another computation).
void timm_norm_layer(const json& args, VitConfig& c, std::vector<std::string>& notes, const std::string& what) {
  const bool said = args.contains("norm_layer") && args["norm_layer"] == "rmsnorm";
  if (c.rms_norm && !said)
    throw Error(what + ": unsupported model: blocks.0.norm1 has no bias, an RMSNorm (timm norm_layer 'rmsnorm') that no "
                       "config.json model_args.norm_layer confirms, which vitlens' ViT block does not compute");
  if (said && !c.rms_norm)
    throw Error(what + ": config.json model_args.norm_layer is 'rmsnorm' but blocks.0.norm1.bias is there");
  if (c.rms_norm) notes.push_back("RMSNorm for every norm (model_args.norm_layer 'rmsnorm'): x rsqrt(mean(x^2) + eps) weight");
}

// The activation, by timm's act_layer name.
void read_timm_activation(const json& args, VitConfig& c, const std::string& what) {
  static const std::pair<const char*, Activation> kActs[] = {
      {"gelu", Activation::Gelu}, {"gelu_tanh", Activation::GeluTanh}, {"quick_gelu", Activation::QuickGelu}};
  if (!args.contains("act_layer") || args["act_layer"].is_null()) return;
  const std::string act = args["act_layer"].is_string() ? args["act_layer"].get<std::string>() : args["act_layer"].dump();
  for (const auto& [name, a] : kActs)
    if (act == name) {
      c.act = a;
      return;
    }
  throw Error(what + ": unsupported model: config.json model_args.act_layer '" + act + "'; vitlens computes gelu, gelu_tanh and quick_gelu");
}

// num_heads: model_args, then the architecture's standard width, then --heads.
void read_timm_heads(const TimmConfig& tc, const LoadOptions& options, bool heads_known, ConvertedModel& m,
                     const std::string& what) {
  VitConfig& c = m.config;
  const json& args = tc.args;
  // Where the count came from, for a --heads that contradicts it.
  std::string source = heads_known ? "architecture '" + tc.arch + "' has" : "";
  if (args.contains("num_heads")) {
    if (!args["num_heads"].is_number_integer() || args["num_heads"].get<int64_t>() < 1 || args["num_heads"].get<int64_t>() > c.embed_dim)
      throw Error(what + ": config.json model_args.num_heads is not an integer in [1, " + std::to_string(c.embed_dim) + "]");
    c.num_heads = static_cast<int>(args["num_heads"].get<int64_t>());
    heads_known = true;
    source = "model_args.num_heads says";
  }
  if (options.heads > 0) {
    if (heads_known && options.heads != c.num_heads)
      throw Error(what + ": --heads " + std::to_string(options.heads) + " contradicts config.json (" + source + " " +
                  std::to_string(c.num_heads) + " heads)");
    c.num_heads = options.heads;
    if (!heads_known) m.notes.push_back("num_heads " + std::to_string(options.heads) + " from --heads");
    heads_known = true;
  }
  if (!heads_known) {
    // Name what is missing: the file, or the keys in it that would have given the count.
    const std::string missing = !tc.present      ? "no config.json beside it"
                                : tc.arch.empty() ? "config.json has neither 'architecture' nor model_args.num_heads"
                                                  : "config.json has no model_args.num_heads and architecture '" + tc.arch +
                                                        "' names no standard width of " + std::to_string(c.embed_dim);
    throw Error(what + ": the number of attention heads cannot be read from the tensors (width " +
                std::to_string(c.embed_dim) + "; " + missing + "): pass --heads");
  }
}

// The size the model was built for, as timm builds it: model_args.img_size (what create_model
// was given) over pretrained_cfg.input_size (the size the weights were trained at, which a model
// made with another img_size, e.g. dynamic_img_size=True, keeps); 0 x 0 when neither says.
void timm_built_size(const TimmConfig& tc, int& h, int& w, std::vector<std::string>& notes) {
  auto pair_of = [](const json& v, size_t first, int& a, int& b) {
    if (!v.is_array() || v.size() != first + 2 || !v[first].is_number_integer() || !v[first + 1].is_number_integer()) return false;
    a = v[first].get<int>();
    b = v[first + 1].get<int>();
    return true;
  };
  int pre_h = 0, pre_w = 0;
  const bool from_pre = tc.pre.contains("input_size") && pair_of(tc.pre["input_size"], 1, pre_h, pre_w);
  const json img = tc.args.contains("img_size") ? tc.args["img_size"] : json();
  if (img.is_number_integer()) h = w = img.get<int>();
  else if (!pair_of(img, 0, h, w)) h = w = 0;
  if (h == 0 && from_pre) h = pre_h, w = pre_w;
  else if (h != 0 && from_pre && (pre_h != h || pre_w != w))
    notes.push_back("image size " + std::to_string(h) + "x" + std::to_string(w) + " from model_args.img_size, as timm builds it (pretrained_cfg.input_size says " +
                    std::to_string(pre_h) + "x" + std::to_string(pre_w) + ")");
}

// Image size and whether the positional table covers the prefix tokens (no_embed_class).
void timm_image_size(const Tensors& t, const TimmConfig& tc, ConvertedModel& m) {
  const std::string& what = t.what;
  VitConfig& c = m.config;
  const int dim = c.embed_dim, patch = c.patch_size, prefix = c.prefix_tokens();
  if (!c.pos_embed) {  // rotary positions only (DINOv3): the size timm builds, any grid runs
    timm_built_size(tc, c.img_h, c.img_w, m.notes);
    const std::string size_text = std::to_string(c.img_h) + "x" + std::to_string(c.img_w);
    if (c.img_h < 1 || c.img_w < 1 || c.img_h > 16384 || c.img_w > 16384)
      throw Error(what + ": config.json gives no input size in [1, 16384] (model_args.img_size or pretrained_cfg.input_size), "
                  "and without 'pos_embed' the tensors cannot say it");
    if (c.img_h % patch || c.img_w % patch)
      throw Error(what + ": config.json input size " + size_text + " is not a multiple of the patch size " + std::to_string(patch));
    return;
  }
  const TensorData& pos = t.peek("pos_embed");
  if (pos.shape.size() != 3 || pos.shape[0] != 1 || pos.shape[2] != dim)
    throw Error(what + ": tensor 'pos_embed' has shape " + shape_text(pos.shape) + ", expected [1, tokens, " + std::to_string(dim) + "]");
  const int64_t pos_rows = pos.shape[1];
  int img_h = 0, img_w = 0;
  timm_built_size(tc, img_h, img_w, m.notes);
  const std::string size_text = std::to_string(img_h) + "x" + std::to_string(img_w);
  if (img_h < 0 || img_w < 0 || img_h > 16384 || img_w > 16384)
    throw Error(what + ": config.json input size " + size_text + " is not in [1, 16384]");
  if (img_h > 0) {
    if (img_h % patch || img_w % patch)
      throw Error(what + ": config.json input size " + size_text + " is not a multiple of the patch size " + std::to_string(patch) +
                  " (patch_embed.proj.weight)");
    const int64_t patches = static_cast<int64_t>(img_h / patch) * (img_w / patch);
    if (pos_rows != prefix + patches && pos_rows != patches)
      throw Error(what + ": config.json input size " + size_text + " gives " + std::to_string(patches) + " patches, but pos_embed has " +
                  std::to_string(pos_rows) + " rows for " + std::to_string(prefix) + " prefix token(s)");
    c.pos_embed_prefix = pos_rows == prefix + patches;
  } else {
    int side = square_side(pos_rows - prefix);
    c.pos_embed_prefix = side > 0;
    if (side == 0) side = square_side(pos_rows);
    if (side == 0 || prefix == 0) c.pos_embed_prefix = true;
    if (side == 0)
      throw Error(what + ": pos_embed has " + std::to_string(pos_rows) + " rows, not a square patch grid plus " +
                  std::to_string(prefix) + " prefix token(s); vitlens cannot infer the image size");
    img_h = img_w = side * patch;
    m.notes.push_back("image size " + std::to_string(img_h) + "x" + std::to_string(img_w) + " from pos_embed (" + std::to_string(side) +
                      "x" + std::to_string(side) + " patches" + (c.pos_embed_prefix || prefix == 0 ? "" : ", no rows for the prefix tokens") + ")");
  }
  if (tc.args.contains("no_embed_class") && tc.args["no_embed_class"].is_boolean() &&
      tc.args["no_embed_class"].get<bool>() == c.pos_embed_prefix && prefix > 0)
    throw Error(what + ": config.json model_args.no_embed_class is " + tc.args["no_embed_class"].dump() + " but pos_embed has " +
                std::to_string(pos_rows) + " rows");
  c.img_h = img_h;
  c.img_w = img_w;
}

// Rotary embeddings: what the architecture name set (timm_architecture_options), then
// config.json's model_args as Eva reads them; a missing position table needs rotary positions.
void timm_rope_options(const TimmConfig& tc, bool eva_names, ConvertedModel& m, const std::string& what) {
  VitConfig& c = m.config;
  const json& args = tc.args;
  const std::string file = "config.json model_args";
  auto refuse = [&](const std::string& why) {
    throw Error(what + ": unsupported model: " + why + ", which vitlens' ViT block does not compute (see README, Supported models)");
  };
  if (args.contains("use_rot_pos_emb") && args["use_rot_pos_emb"].is_boolean() && !args["use_rot_pos_emb"].get<bool>())
    c.rope = Rope::None;
  if (args.contains("rope_type") && !args["rope_type"].is_null() && c.rope != Rope::None) {
    const json& type = args["rope_type"];
    if (type == "dinov3") c.rope = Rope::Dinov3;
    else if (type == "cat") c.rope = Rope::Eva;
    else refuse("config.json model_args.rope_type " + type.dump() + " (vitlens computes 'dinov3' and 'cat')");
  }
  if (c.rope != Rope::None) {
    c.rope_temperature = static_cast<float>(json_number(args, "rope_temperature", c.rope_temperature, what, file));
    c.rope_rotate_half = json_bool(args, "rope_rotate_half", c.rope_rotate_half, what, file);
    c.rope_grid_offset = static_cast<float>(json_number(args, "rope_grid_offset", c.rope_grid_offset, what, file));
    if (args.contains("ref_feat_shape") && !args["ref_feat_shape"].is_null()) {
      const json& ref = args["ref_feat_shape"];
      if (ref.is_number_integer()) c.rope_ref_h = c.rope_ref_w = ref.get<int>();
      else if (ref.is_array() && ref.size() == 2 && ref[0].is_number_integer() && ref[1].is_number_integer())
        c.rope_ref_h = ref[0].get<int>(), c.rope_ref_w = ref[1].get<int>();
      else throw Error(what + ": config.json model_args.ref_feat_shape is not an integer or [rows, cols]");
      if (c.rope == Rope::Dinov3) c.rope_ref_h = c.rope_ref_w = 0;  // create_rope_embed drops it for DINOv3
    }
  } else if (args.contains("use_rot_pos_emb") && args["use_rot_pos_emb"] == true) {
    refuse("rotary position embeddings of architecture '" + tc.arch + "'");
  }
  if (!c.pos_embed && c.rope == Rope::None)
    refuse(tc.present ? "it has no position table 'pos_embed' (its positions are rotary or relative)"
                      : "it has no position table 'pos_embed': its positions are rotary (as DINOv3's), and without its "
                        "config.json the architecture that says how is unknown");
  if (c.rope != Rope::None && !eva_names)
    throw Error(what + ": config.json architecture '" + tc.arch + "' is timm's Eva (rotary positions), but the tensors are a "
                "VisionTransformer's (no gamma_1, q_bias, q_proj or fc1_g)");
  if (eva_names && c.rope == Rope::None && c.pos_embed && tc.arch.empty())
    refuse("it has timm Eva blocks (gamma_1, q_bias) and no config.json to say whether they use rotary position embeddings");
  if (c.rope == Rope::None) return;
  std::ostringstream note;
  note << "rotary position embeddings (" << rope_name(c.rope) << ", temperature " << c.rope_temperature << ", "
       << (c.rope_rotate_half ? "rotate-half" : "interleaved") << " pairs";
  if (c.rope_ref_h > 0) note << ", coordinates scaled to a " << c.rope_ref_h << "x" << c.rope_ref_w << " reference grid";
  if (c.rope_grid_offset != 0.0f) note << ", grid offset " << c.rope_grid_offset;
  note << ") on the patch tokens' queries and keys, computed for each image's own grid"
       << (c.pos_embed ? ", beside the position table" : "; no position table");
  m.notes.push_back(note.str());
}

// timm's global_pool: config.json's (save_for_hf writes it at the top and in model_args), else
// VisionTransformer's default ('token'; a model without a class token cannot have it).
// Auto when config.json names a pool vitlens' classifier does not compute (''); 'map' is the
// attention pool's output.
HeadPool timm_head_pool(const TimmConfig& tc, const VitConfig& c, bool fc_norm, std::vector<std::string>& notes,
                        const std::string& what) {
  const json* said = tc.cfg.contains("global_pool") ? &tc.cfg["global_pool"]
                     : tc.args.contains("global_pool") ? &tc.args["global_pool"] : nullptr;
  if (!said || said->is_null()) {
    if (c.attention_pool) return HeadPool::Map;
    if (!tc.present && (fc_norm || !c.class_token)) {
      notes.push_back("classifier pooling: the mean of the patch tokens, inferred (no config.json; " +
                      std::string(fc_norm ? "fc_norm" : "no class token") + ")");
      return HeadPool::Avg;
    }
    // timm's Eva (the rotary families) pools with 'avg' by default, VisionTransformer with 'token'.
    return c.class_token && c.rope == Rope::None ? HeadPool::Token : HeadPool::Avg;
  }
  const std::string pool = said->is_string() ? said->get<std::string>() : said->dump();
  HeadPool out = HeadPool::Auto;
  // '' (no pooling) is not a pool this head reads: Auto says so. 'map' reads the attention pool.
  if (!parse_head_pool(pool, out) || out == HeadPool::Auto) return HeadPool::Auto;
  if (out == HeadPool::Map && !c.attention_pool)
    throw Error(what + ": config.json global_pool is 'map' but the file has no attention pool (attn_pool.*)");
  if (out == HeadPool::Token && !c.class_token)
    throw Error(what + ": config.json global_pool is 'token' but the model has no class token (cls_token)");
  return out;
}

// timm's label names: config.json's label_names (a list, or {index: name}), at the top as
// save_for_hf writes them or in pretrained_cfg; else ImageNet-1k's for a 1000-class head (timm's
// convention for num_classes 1000), with "background" first for a 1001-class one (TF-slim heads,
// timm label_offset 1). Other heads (ImageNet-21k's 21843, 11k, 12k) get no names.
void timm_class_names(const TimmConfig& tc, int classes, ConvertedModel& m) {
  const json* said = tc.cfg.contains("label_names") ? &tc.cfg["label_names"]
                     : tc.pre.contains("label_names") ? &tc.pre["label_names"] : nullptr;
  if (said && (said->is_array() || said->is_object())) {
    std::vector<std::string> names(static_cast<size_t>(classes));
    bool all = true;
    for (int k = 0; k < classes; ++k) {
      const json* v = said->is_array() ? (k < static_cast<int>(said->size()) ? &(*said)[static_cast<size_t>(k)] : nullptr)
                                       : (said->contains(std::to_string(k)) ? &(*said)[std::to_string(k)] : nullptr);
      if (!v || !v->is_string()) {
        all = false;
        break;
      }
      names[static_cast<size_t>(k)] = v->get<std::string>();
    }
    if (all && (!said->is_array() || static_cast<int>(said->size()) == classes)) {
      // timm's hub configs name ImageNet classes by synset ("n01440764") and describe them in
      // label_descriptions ({"n01440764": "tench, Tinca tinca"}): the description is the name shown.
      const json* text = tc.cfg.contains("label_descriptions") ? &tc.cfg["label_descriptions"]
                         : tc.pre.contains("label_descriptions") ? &tc.pre["label_descriptions"] : nullptr;
      bool described = false;
      if (text && text->is_object())
        for (std::string& name : names)
          if (text->contains(name) && (*text)[name].is_string()) {
            name = (*text)[name].get<std::string>();
            described = true;
          }
      m.class_names = std::move(names);
      m.class_names_source = described ? "config.json label_names and label_descriptions" : "config.json label_names";
      return;
    }
    m.notes.push_back("config.json label_names does not name each of the " + std::to_string(classes) + " classes: not used");
  }
  if (classes == 1000 || classes == 1001) {
    m.class_names = imagenet1k_class_names();
    if (classes == 1001) m.class_names.insert(m.class_names.begin(), "background");
    m.class_names_source = classes == 1000 ? "ImageNet-1k's standard names (assets/labels/imagenet-1k.txt)"
                                           : "ImageNet-1k's standard names after 'background' (assets/labels/imagenet-1k.txt)";
    m.notes.push_back("class names: " + m.class_names_source + ", timm's convention for a " + std::to_string(classes) +
                      "-class head; config.json gives none");
  }
}

// The classifier: timm's head (C, D), with DeiT's distillation head (averaged with it, as timm's
// eval forward) and fc_norm; num_classes checked; the pooling and the class names.
void timm_head(Tensors& t, const TimmConfig& tc, ConvertedModel& m) {
  VitConfig& c = m.config;
  const bool head = t.has("head.weight");
  if (tc.cfg.contains("num_classes") && tc.cfg["num_classes"].is_number_integer()) {
    const int64_t classes = tc.cfg["num_classes"].get<int64_t>();
    const int64_t in_file = head ? t.peek("head.weight").shape.at(0) : 0;
    if (classes != in_file)
      throw Error(t.what + ": config.json num_classes is " + std::to_string(classes) + " but head.weight has " +
                  std::to_string(in_file) + " rows");
  }
  if (head && c.rms_norm && t.has("fc_norm.weight") && !t.has("fc_norm.bias")) {  // timm: fc_norm is the model's RmsNorm
    t.drop_prefix("head.");
    t.drop_prefix("fc_norm.");
    m.notes.push_back("classifier ignored: its fc_norm is an RMSNorm, which vitlens' classifier does not compute, so there are "
                      "no predictions");
  }
  const bool fc_norm = t.has("fc_norm.weight");
  const HeadPool pool = t.has("head_dist.weight") ? HeadPool::Token  // VisionTransformerDistilled reads x[:, 0] and x[:, 1]
                                                  : head ? timm_head_pool(tc, c, fc_norm, m.notes, t.what) : HeadPool::Auto;
  if (head && pool == HeadPool::Auto) {
    const std::string said = tc.cfg.contains("global_pool") ? tc.cfg["global_pool"].dump() : tc.args.value("global_pool", json()).dump();
    t.drop_prefix("head.");
    m.notes.push_back("classifier ignored: config.json global_pool " + said +
                      " is a pooling vitlens' classifier does not compute (token, avg, max, avgmax, map), so there are no predictions");
  }
  if (!t.has("head.weight")) {
    if (t.drop_prefix("fc_norm."))
      m.notes.push_back("fc_norm ignored: it norms the pooled vector of a classifier the file does not have");
    if (t.drop_prefix("head_dist.")) m.notes.push_back("head_dist ignored: the file has no head beside it");
    return;
  }
  if (t.has("head_dist.weight") && !c.dist_token)
    throw Error(t.what + ": tensor 'head_dist.weight' is present but the model has no distillation token (dist_token)");
  c.head_pool = pool;
  if (tc.args.contains("pool_include_prefix") && tc.args["pool_include_prefix"].is_boolean())
    c.pool_include_prefix = tc.args["pool_include_prefix"].get<bool>();
  timm_class_names(tc, static_cast<int>(t.peek("head.weight").shape.at(0)), m);
}

}  // namespace

using namespace layout_support;

ConvertedModel convert_timm(layout_support::Tensors t, const std::string& folder, const LoadOptions& options) {
  const std::string& what = t.what;
  const bool eva_names = eva_to_vit_names(t);
  refuse_timm_features(t);
  const TimmConfig tc = read_timm_config(folder, what);
  refuse_timm_args(tc.args, what);
  ConvertedModel m;
  m.format = "timm";
  VitConfig& c = m.config;
  timm_options_from_tensors(t, m);
  c.name = tc.arch.empty() ? capped_text(what.substr(what.find_last_of('/') + 1), kMaxModelNameBytes) : tc.arch;
  c.description = tc.arch.empty() ? "timm layout, architecture inferred from the tensors" : "timm " + tc.arch;

  bool heads_known = false;
  if (!tc.arch.empty()) timm_architecture_options(tc.arch, c.embed_dim, c, heads_known, what);
  if (contains(tc.arch, "_clip_") && contains(tc.arch, ".openai") && !contains(tc.arch, "quickgelu"))
    m.notes.push_back("GELU as timm runs '" + tc.arch + "'; the original OpenAI CLIP uses quick-GELU (timm's *_clip_quickgelu_* name)");
  if (c.post_norm) m.notes.push_back("residual post-norm blocks (timm ResPostBlock), from the architecture name");
  if (c.attention_pool) {
    // timm's Eva pools every token, the class and register tokens too, with its own GELU MLP:
    // not the VisionTransformer pool vitlens computes.
    if (eva_names)
      throw Error(what + ": unsupported model: an attention pool on timm Eva blocks (DINOv3 / EVA-02 with global_pool 'map') "
                  "reads the prefix tokens too, which vitlens' attention pool does not compute");
    if (tc.args.contains("pool_include_prefix") && tc.args["pool_include_prefix"] == json(true))
      throw Error(what + ": unsupported model: config.json model_args.pool_include_prefix = true means an attention pool over the "
                  "prefix tokens too, which vitlens' attention pool does not compute");
    m.notes.push_back("attention pool (timm global_pool 'map'): its latent query over the patch tokens is the query 'pool'");
  }
  timm_rope_options(tc, eva_names, m, what);
  if (eva_names)
    m.notes.push_back("timm Eva names read as the ViT block's: gamma_1/gamma_2 as LayerScale, the q and v biases as one qkv bias "
                      "with a zero key bias, separate q/k/v and fc1_g/fc1_x stacked");
  if (c.swiglu)
    m.notes.push_back("SwiGLU MLP: fc2(silu(gate) * value), hidden width " + std::to_string(c.mlp_hidden()) +
                      (c.mlp_norm ? ", LayerNorm before fc2" : ""));
  else if (c.mlp_norm)
    m.notes.push_back("a LayerNorm inside the MLP, before fc2");
  if (c.attn_out_norm) m.notes.push_back("a LayerNorm on the heads' concatenated output, before attn.proj");
  check_args_against_tensors(tc.args, c, what);
  timm_norm_layer(tc.args, c, m.notes, what);
  read_timm_activation(tc.args, c, what);
  read_timm_heads(tc, options, heads_known, m, what);
  if (c.attention_pool && tc.args.contains("attn_pool_num_heads") && tc.args["attn_pool_num_heads"].is_number_integer() &&
      tc.args["attn_pool_num_heads"].get<int64_t>() != c.num_heads)
    throw Error(what + ": unsupported model: config.json model_args.attn_pool_num_heads " + tc.args["attn_pool_num_heads"].dump() +
                " differs from the blocks' " + std::to_string(c.num_heads) + " heads; vitlens' attention pool has the blocks' heads");
  timm_image_size(t, tc, m);

  if (!json_rgb(tc.pre, "mean", c.mean) || !json_rgb(tc.pre, "std", c.std)) {
    c.mean = {0.5f, 0.5f, 0.5f};
    c.std = {0.5f, 0.5f, 0.5f};
    m.notes.push_back("mean/std 0.5 assumed (no pretrained_cfg mean/std in a config.json)");
  }
  if (!tc.present) {
    m.notes.push_back("no config.json beside the file: every option read from the tensors (patch " + std::to_string(c.patch_size) +
                      " from patch_embed.proj.weight, width " + std::to_string(c.embed_dim) + ", depth " + std::to_string(c.depth) +
                      " from the blocks, MLP " + std::to_string(c.mlp_hidden()) + ")");
    m.notes.push_back("GELU (exact) and LayerNorm eps 1e-6 assumed: timm's defaults");
  }
  timm_head(t, tc, m);
  m.tensors = std::move(t.map);
  return m;
}


void timm_architecture_options(const std::string& arch, int embed_dim, VitConfig& c, bool& heads_known,
                               const std::string& what) {
  const std::string base = arch.substr(0, arch.find('.'));
  if (!starts_with(base, "vit_") && !starts_with(base, "deit_") && !starts_with(base, "deit3_") && !starts_with(base, "eva02_"))
    throw Error(what + ": unsupported model: timm architecture '" + arch +
                "' is not a VisionTransformer family vitlens maps (vit_*, deit_*, deit3_*, or Eva's eva02_*; see README, Supported models)");
  // Families whose entrypoint changes the computation; most also show it in their tensor names,
  // which refuse_timm_features names when there is no config.json.
  static const std::pair<const char*, const char*> kRefused[] = {
      {"rope", "it uses timm's own rotary position embeddings (vit_*_rope_*), not DINOv3's or EVA-02's"},
      {"lingbot", "it is LingBot-Vision (timm's Eva with options vitlens does not map)"},
      {"sapiens2", "it is Sapiens2 (grouped-query attention)"},
      {"eva02_enormous", "it uses Eva's residual post-norm blocks"},
      {"relpos", "it uses relative position biases instead of a position table"},
      {"_xp_", "it uses parallel blocks"},
      {"_parallel_", "it uses parallel blocks"},
      {"_18x2_", "it uses parallel blocks (timm's ParallelThingsBlock)"},
      {"_pwee_", "it uses parallel blocks (timm's ParallelScalingBlock)"},
      {"_dpwee_", "it uses parallel blocks with differential attention"},
      {"_dwee_", "it uses differential attention (timm's DiffAttention)"},
      {"_dlittle_", "it uses differential attention (timm's DiffAttention)"},
      {"naflex", "it uses NaFlex variable-resolution patches"},
      {"resnet", "it has a CNN stem"},
      {"_pe_", "it is a Perception Encoder tower with rotary embeddings"},
  };
  for (const auto& [part, why] : kRefused)
    if (contains(base, part))
      throw Error(what + ": unsupported model: timm architecture '" + arch + "' is refused because " + why);
  // Options the entrypoint sets (vision_transformer.py) that leave the tensor names as they are.
  static const std::pair<const char*, void (*)(VitConfig&)> kOptions[] = {
      {"_clip_", [](VitConfig& v) { v.norm_eps = 1e-5f; }},                    // norm_layer=partial(LayerNorm, eps=1e-5)
      {"quickgelu", [](VitConfig& v) { v.act = Activation::QuickGelu; }},      // act_layer='quick_gelu'
      {"_rpn_", [](VitConfig& v) { v.post_norm = true; }},                     // block_fn=ResPostBlock
      // eva.py vit_*_dinov3*: rope_type='dinov3', rope_temperature=100, rope_rotate_half=True,
      // norm_layer=partial(LayerNorm, eps=1e-5)
      {"dinov3", [](VitConfig& v) {
         v.rope = Rope::Dinov3, v.rope_temperature = 100.0f, v.rope_rotate_half = true, v.norm_eps = 1e-5f;
       }},
      // eva.py eva02_*: use_rot_pos_emb=True (RotaryEmbeddingCat, in_pixels=False, temperature
      // 10000, interleaved), ref_feat_shape=(16, 16)
      {"eva02_", [](VitConfig& v) {
         v.rope = Rope::Eva, v.rope_temperature = 10000.0f, v.rope_rotate_half = false, v.rope_ref_h = v.rope_ref_w = 16;
         v.norm_eps = 1e-6f;  // timm's LayerNorm default, also in the eva02_*_clip_* names
       }},
  };
  for (const auto& [part, apply] : kOptions)
    if (contains(base, part)) apply(c);
  // SigLIP 2's towers (with or without _gap) set act_layer='gelu_tanh'; the first SigLIP's keep GELU.
  static const char* const kGeluTanh[] = {"vit_base_patch32_siglip_256",     "vit_large_patch16_siglip_512",
                                          "vit_so400m_patch16_siglip_256",   "vit_so400m_patch16_siglip_384",
                                          "vit_so400m_patch16_siglip_512",   "vit_giantopt_patch16_siglip_256",
                                          "vit_giantopt_patch16_siglip_384"};
  std::string without_gap = base;
  if (const size_t gap = without_gap.find("_gap"); gap != std::string::npos) without_gap.erase(gap, 4);
  for (const char* name : kGeluTanh)
    if (without_gap == name) c.act = Activation::GeluTanh;
  // num_heads of timm's standard widths: the name's size word and the tensor width must agree.
  static const struct { const char* size; int dim; int heads; } kHeads[] = {
      {"_tiny_", 192, 3},   {"_small_", 384, 6},  {"_base_", 768, 12},     {"_medium_", 512, 8},
      {"_large_", 1024, 16}, {"_huge_", 1280, 16}, {"_giant_", 1408, 16},  {"_giant_", 1536, 24},
      {"_gigantic_", 1664, 16},
      {"_huge_plus_", 1280, 20}, {"_7b_", 4096, 32},  // DINOv3's, after "_huge_" so that they win
  };
  for (const auto& h : kHeads)
    if (contains(base + "_", h.size) && embed_dim == h.dim) {
      c.num_heads = h.heads;
      heads_known = true;
    }
}

}  // namespace vitlens
