// Hugging Face transformers' save_pretrained layout (ViT, DeiT, Dinov2, Dinov2WithRegisters,
// CLIPVisionModel, SiglipVisionModel with its attention-pool head, DINOv3ViTModel) onto vitlens'
// block: one HfFamily row per family (prefix, block names, the names around the blocks, defaults),
// q/k/v fused into timm's qkv, pooled-only parts dropped.
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

// [SECTION] Hugging Face transformers

// Where one family keeps a block's tensors, relative to "<layers>.<i>.".
struct HfBlockNames {
  const char* layers;  // "encoder.layer" or "encoder.layers"
  const char* norm1;
  const char* q;
  const char* k;
  const char* v;
  const char* proj;
  const char* ls1;  // nullptr without LayerScale
  const char* norm2;
  const char* fc1;
  const char* fc2;
  const char* ls2;
  const char* fc1_gate = nullptr;  // a gated MLP's gate projection (DINOv3 use_gated_mlp), stacked before fc1
  bool fc1_gated = false;          // fc1 is already [gate | value] (2 Hm, D), as Dinov2's saved weights_in
};

constexpr HfBlockNames kHfVitBlock{"encoder.layer", "layernorm_before", "attention.attention.query", "attention.attention.key",
                                   "attention.attention.value", "attention.output.dense", nullptr, "layernorm_after",
                                   "intermediate.dense", "output.dense", nullptr};
constexpr HfBlockNames kHfDinov2Block{"encoder.layer", "norm1", "attention.attention.query", "attention.attention.key",
                                      "attention.attention.value", "attention.output.dense", "layer_scale1.lambda1", "norm2",
                                      "mlp.fc1", "mlp.fc2", "layer_scale2.lambda1"};
// Dinov2 with use_swiglu_ffn (giant): save_pretrained writes Dinov2SwiGLUFFN's gate_proj and
// up_proj as one weights_in, gate first (transformers' conversion_mapping chunks it on load).
constexpr HfBlockNames kHfDinov2SwigluBlock{"encoder.layer", "norm1", "attention.attention.query", "attention.attention.key",
                                            "attention.attention.value", "attention.output.dense", "layer_scale1.lambda1",
                                            "norm2", "mlp.weights_in", "mlp.weights_out", "layer_scale2.lambda1", nullptr, true};
constexpr HfBlockNames kHfDinov3Block{"layer", "norm1", "attention.q_proj", "attention.k_proj", "attention.v_proj",
                                      "attention.o_proj", "layer_scale1.lambda1", "norm2", "mlp.up_proj", "mlp.down_proj",
                                      "layer_scale2.lambda1", "mlp.gate_proj"};
constexpr HfBlockNames kHfClipBlock{"encoder.layers", "layer_norm1", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                    "self_attn.out_proj", nullptr, "layer_norm2", "mlp.fc1", "mlp.fc2", nullptr};

// One transformers family: its names around the blocks and the defaults its config leaves out.
// A nullptr name is a part the family does not have.
struct HfFamily {
  const char* model_type;
  const char* format;          // ConvertedModel::format
  const char* prefix;          // the base model's prefix in a task model's file ("vit.")
  const HfBlockNames* block;
  const char* patch_embed;     // "<name>.weight" (D, 3, P, P); "<name>.bias" when patch_bias
  bool patch_bias;
  const char* cls_token;       // (1, 1, D), or CLIP's (D)
  const char* dist_token;      // DeiT's distillation token (1, 1, D)
  const char* pos_embed;       // (1, prefix + Np, D), or CLIP's nn.Embedding (prefix + Np, D)
  const char* norm_pre;        // CLIP's pre_layrnorm
  const char* norm;            // the final LayerNorm over every token
  const char* classifier;      // a (C, D) classifier on the class token, read as timm's head
  const char* mlp_width_key;   // "intermediate_size", or nullptr: DINOv2's mlp_ratio
  bool qkv_bias_key;           // the config's qkv_bias counts (CLIP's always has the biases)
  double norm_eps;             // layer_norm_eps when the config leaves it out
  std::array<float, 3> mean, std;  // when there is no preprocessor_config.json
  const char* attention_pool;  // SigLIP's SiglipMultiheadAttentionPoolingHead ("head"), when the file has it
  Rope rope = Rope::None;      // rotary positions (DINOv3: rope_theta, rotate-half pairs, no position table)
  bool optional_biases = false;  // each Linear's bias as the config says (query_bias, key_bias, value_bias,
                                 // proj_bias, mlp_bias); a missing one is a zero bias
};

const std::array<float, 3> kHalf{0.5f, 0.5f, 0.5f};
const HfFamily kHfFamilies[] = {
    {"vit", "hf-vit", "vit.", &kHfVitBlock, "embeddings.patch_embeddings.projection", true, "embeddings.cls_token", nullptr,
     "embeddings.position_embeddings", nullptr, "layernorm", "classifier", "intermediate_size", true, 1e-12, kHalf, kHalf, nullptr},
    {"deit", "hf-deit", "deit.", &kHfVitBlock, "embeddings.patch_embeddings.projection", true, "embeddings.cls_token",
     "embeddings.distillation_token", "embeddings.position_embeddings", nullptr, "layernorm", "cls_classifier",
     "intermediate_size", true, 1e-12, kImagenetMean, kImagenetStd, nullptr},
    {"dinov2", "hf-dinov2", "dinov2.", &kHfDinov2Block, "embeddings.patch_embeddings.projection", true, "embeddings.cls_token",
     nullptr, "embeddings.position_embeddings", nullptr, "layernorm", nullptr, nullptr, true, 1e-12, kImagenetMean, kImagenetStd,
     nullptr},
    {"dinov2_with_registers", "hf-dinov2", "dinov2_with_registers.", &kHfDinov2Block, "embeddings.patch_embeddings.projection",
     true, "embeddings.cls_token", nullptr, "embeddings.position_embeddings", nullptr, "layernorm", nullptr, nullptr, true, 1e-12,
     kImagenetMean, kImagenetStd, nullptr},
    {"clip_vision_model", "hf-clip", "vision_model.", &kHfClipBlock, "embeddings.patch_embedding", false,
     "embeddings.class_embedding", nullptr, "embeddings.position_embedding.weight", "pre_layrnorm", nullptr, nullptr,
     "intermediate_size", false, 1e-5, kClipMean, kClipStd, nullptr},
    // SiglipVisionModel: no class token, post_layernorm over every token, then the pooling head.
    {"siglip_vision_model", "hf-siglip", "vision_model.", &kHfClipBlock, "embeddings.patch_embedding", true, nullptr, nullptr,
     "embeddings.position_embedding.weight", nullptr, "post_layernorm", nullptr, "intermediate_size", false, 1e-6, kHalf, kHalf,
     "head"},
    // DINOv3ViTModel saves its encoder's blocks as layer.<i> (its module path is model.layer.<i>).
    {"dinov3_vit", "hf-dinov3", "model.", &kHfDinov3Block, "embeddings.patch_embeddings", true, "embeddings.cls_token",
     nullptr, nullptr, nullptr, "norm", nullptr, "intermediate_size", false, 1e-5, kImagenetMean, kImagenetStd, nullptr, Rope::Dinov3,
     true},
};

// Parts of a file that act after the tokens vitlens shows (pooled vectors, task heads): dropped,
// each with its note.
const std::pair<const char*, const char*> kHfPooledOnly[] = {
    {"pooler.", "pooler ignored (a dense + tanh on the class token, after the tokens shown)"},
    {"post_layernorm.", "post_layernorm ignored: it norms the pooled class token only; the tokens are shown as they leave the last block"},
    {"visual_projection.", "visual_projection ignored (it maps the pooled vector into CLIP's joint space)"},
    {"distillation_classifier.", "distillation_classifier (DeiT's distillation head) ignored"},
    {"classifier.", "classifier ignored: it is not a (classes, width) head on the class token (Dinov2's reads the class "
                    "token and the patch mean), so there are no predictions"},
    {"embeddings.mask_token", nullptr},
    {"embeddings.position_ids", nullptr},
};

Activation hf_activation(const json& cfg, const std::string& what) {
  static const std::pair<const char*, Activation> kActs[] = {
      {"gelu", Activation::Gelu},          {"gelu_new", Activation::GeluTanh},  {"gelu_pytorch_tanh", Activation::GeluTanh},
      {"gelu_fast", Activation::GeluTanh}, {"quick_gelu", Activation::QuickGelu}};
  const std::string act = cfg.contains("hidden_act") && cfg["hidden_act"].is_string() ? cfg["hidden_act"].get<std::string>() : "gelu";
  for (const auto& [name, a] : kActs)
    if (act == name) return a;
  throw Error(what + ": unsupported model: config.json hidden_act '" + act +
              "'; vitlens computes gelu, gelu_new / gelu_pytorch_tanh and quick_gelu");
}

// config.json and the family it names; a whole CLIPModel's vision_config, its text tower dropped.
const HfFamily& read_hf_config(Tensors& t, const std::string& folder, json& cfg, std::vector<std::string>& notes) {
  const std::string& what = t.what;
  const std::string config_path = folder + "/config.json";
  if (!is_file(config_path))
    throw Error(what + ": a Hugging Face checkpoint needs its config.json beside it, and " + config_path + " is missing");
  cfg = read_json(config_path, what);
  std::string type = cfg.contains("model_type") && cfg["model_type"].is_string() ? cfg["model_type"].get<std::string>() : "";
  if (type == "clip") {
    if (!cfg.contains("vision_config") || !cfg["vision_config"].is_object())
      throw Error(what + ": config.json of a CLIP model has no vision_config");
    cfg = json(cfg["vision_config"]);
    for (const char* part : {"text_model.", "text_projection.", "logit_scale"}) t.drop_prefix(part);
    notes.push_back("text tower ignored: the vision tower of a CLIPModel is shown");
    type = "clip_vision_model";
  }
  if (type == "siglip") {
    if (!cfg.contains("vision_config") || !cfg["vision_config"].is_object())
      throw Error(what + ": config.json of a SigLIP model has no vision_config");
    cfg = json(cfg["vision_config"]);
    for (const char* part : {"text_model.", "logit_scale", "logit_bias"}) t.drop_prefix(part);
    notes.push_back("text tower ignored: the vision tower of a SiglipModel is shown");
    type = "siglip_vision_model";
  }
  if (type == "siglip2" || type == "siglip2_vision_model")
    throw Error(what + ": unsupported model: SigLIP 2 in transformers (Siglip2VisionModel) takes variable-resolution patch "
                "sequences (NaFlex: a Linear patch embedding, a position table resized bilinearly with antialiasing to each "
                "image's grid, padded patches masked), which vitlens' fixed patch grid does not compute; timm's "
                "vit_*_siglip_*.v2_webli towers open");
  for (const HfFamily& f : kHfFamilies)
    if (type == f.model_type) return f;
  throw Error(what + ": unsupported model: Hugging Face model_type '" + type +
              "'; vitlens maps vit, deit, dinov2, dinov2_with_registers, dinov3_vit, clip_vision_model, clip, "
              "siglip_vision_model and siglip (see README, Supported models)");
}

// VitConfig::validate's reason, with the config.json keys its vitlens names stand for (the MLP's
// ratio is config.json's own mlp_ratio in a family without `mlp_width_key`, DINOv2's).
std::string in_hf_terms(const std::string& why, const HfFamily& f) {
  static const std::pair<const char*, const char*> kKeys[] = {
      {"embed_dim", "hidden_size"}, {"num_heads", "num_attention_heads"}, {"depth", "num_hidden_layers"},
      {"img_size", "image_size"},   {"mlp_ratio", "intermediate_size / hidden_size"},
      {"norm_eps", "layer_norm_eps"}, {"register_tokens", "num_register_tokens"}, {"rope_temperature", "rope_theta"}};
  std::string keys;
  for (const auto& [ours, theirs] : kKeys)
    if (why.find(ours) != std::string::npos && (f.mlp_width_key || std::string(ours) != "mlp_ratio"))
      keys += std::string(keys.empty() ? "" : ", ") + ours + " is " + theirs;
  return keys.empty() ? why : why + " (" + keys + ")";
}

// The config's numbers, as the family reads them.
void read_hf_options(const json& cfg, const HfFamily& f, const LoadOptions& options, VitConfig& c, const std::string& what) {
  const std::string file = "config.json";
  if (cfg.contains("num_channels") && json_int(cfg, "num_channels", what, file) != 3)
    throw Error(what + ": config.json num_channels is not 3; vitlens feeds RGB images");
  c.embed_dim = json_int(cfg, "hidden_size", what, file);
  c.depth = json_int(cfg, "num_hidden_layers", what, file);
  c.num_heads = json_int(cfg, "num_attention_heads", what, file);
  if (options.heads > 0 && options.heads != c.num_heads)
    throw Error(what + ": --heads " + std::to_string(options.heads) + " contradicts config.json num_attention_heads " +
                std::to_string(c.num_heads));
  c.patch_size = json_int(cfg, "patch_size", what, file);
  if (!cfg.contains("image_size")) throw Error(what + ": config.json has no 'image_size'");
  const json& size = cfg["image_size"];
  auto side = [](const json& v) { return v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= 16384; };
  if (size.is_array() && size.size() == 2 && side(size[0]) && side(size[1])) {
    c.img_h = size[0].get<int>();
    c.img_w = size[1].get<int>();
  } else {
    c.img_h = c.img_w = json_int(cfg, "image_size", what, file);
  }
  c.norm_eps = static_cast<float>(json_number(cfg, "layer_norm_eps", f.norm_eps, what, file));
  c.swiglu = json_bool(cfg, "use_gated_mlp", false, what, file);
  if (c.swiglu) {  // DINOv3ViTGatedMLP: down(act(gate x) * up x); vitlens' gated MLP is SiLU's
    const std::string act = cfg.contains("hidden_act") && cfg["hidden_act"].is_string() ? cfg["hidden_act"].get<std::string>() : "";
    if (act != "silu" && act != "swish")
      throw Error(what + ": unsupported model: config.json use_gated_mlp with hidden_act '" + act +
                  "'; vitlens computes the gated MLP with silu (SwiGLU)");
  } else {
    c.act = hf_activation(cfg, what);
  }
  if (f.optional_biases)
    c.qkv_bias = json_bool(cfg, "query_bias", true, what, file) || json_bool(cfg, "key_bias", false, what, file) ||
                 json_bool(cfg, "value_bias", true, what, file);
  else
    c.qkv_bias = f.qkv_bias_key ? json_bool(cfg, "qkv_bias", true, what, file) : true;
  if (f.rope != Rope::None) {  // DINOv3ViTRopePositionEmbedding: base rope_theta, rotate_half, no offset
    c.rope = f.rope;
    c.rope_temperature = static_cast<float>(json_number(cfg, "rope_theta", 100.0, what, file));
    c.rope_rotate_half = true;
  }
  c.mlp_ratio = f.mlp_width_key ? mlp_ratio_for(c.embed_dim, json_int(cfg, f.mlp_width_key, what, file))
                                : json_number(cfg, "mlp_ratio", 4.0, what, file);
  if (json_bool(cfg, "use_swiglu_ffn", false, what, file)) {
    // Dinov2SwiGLUFFN: two thirds of int(D * mlp_ratio), rounded up to a multiple of 8. The ratio
    // is bounded first, as the config check bounds it: a double past int's range has no int.
    if (!(c.mlp_ratio > 0.0 && c.mlp_ratio <= 64.0))
      throw Error(what + ": config.json mlp_ratio " + json(c.mlp_ratio).dump() + " is not in (0, 64]");
    const int hidden = static_cast<int>(c.embed_dim * c.mlp_ratio);
    const int width = (static_cast<int>(hidden * 2.0 / 3.0) + 7) / 8 * 8;
    if (width < 1) throw Error(what + ": config.json mlp_ratio gives a SwiGLU hidden width of " + std::to_string(width));
    c.swiglu = true;
    c.mlp_ratio = mlp_ratio_for(c.embed_dim, width);
  }
  c.layer_scale = f.block->ls1 != nullptr;
  c.patch_bias = f.patch_bias;
  c.class_token = f.cls_token != nullptr;
  c.dist_token = f.dist_token != nullptr;
  c.pre_norm = f.norm_pre != nullptr;
  c.final_norm = f.norm != nullptr;
  c.attention_pool = f.attention_pool && json_bool(cfg, "vision_use_head", true, what, file);
  c.pos_embed = f.pos_embed != nullptr;
  const std::string family = f.model_type;
  if (family == "dinov2_with_registers" || family == "dinov3_vit")
    c.register_tokens = json_int(cfg, "num_register_tokens", what, file);
  const std::string type = f.model_type;
  c.name = cfg.contains("_name_or_path") && cfg["_name_or_path"].is_string() && !cfg["_name_or_path"].get<std::string>().empty()
               ? cfg["_name_or_path"].get<std::string>()
               : type;
  c.description = "Hugging Face " + type;
  const std::string why = c.validate();
  if (!why.empty()) throw Error(what + ": config.json: " + in_hf_terms(why, f));
}

// The patch embedding and the block count, checked against the config.
void check_hf_shapes(const Tensors& t, const HfFamily& f, const VitConfig& c) {
  const std::string patch_name = std::string(f.patch_embed) + ".weight";
  int dim = 0, patch = 0;
  read_patch_embed(t.peek(patch_name), patch_name, t.what, dim, patch);
  if (dim != c.embed_dim || patch != c.patch_size)
    throw Error(t.what + ": config.json says hidden_size " + std::to_string(c.embed_dim) + ", patch_size " + std::to_string(c.patch_size) +
                " but " + patch_name + " has shape " + shape_text(t.peek(patch_name).shape));
  int blocks = 0;
  while (t.has(std::string(f.block->layers) + "." + std::to_string(blocks) + "." + f.block->norm1 + ".weight")) ++blocks;
  if (blocks != c.depth)
    throw Error(t.what + ": config.json says num_hidden_layers " + std::to_string(c.depth) + " but the file has " +
                std::to_string(blocks) + " blocks");
}

// Patch embedding, prefix tokens and the positional table in timm's names.
void hf_embeddings(Tensors& t, const HfFamily& f, VitConfig& c, TensorMap& out) {
  const int64_t d = c.embed_dim, patches = static_cast<int64_t>(c.grid_h()) * c.grid_w();
  out["patch_embed.proj.weight"] = t.take(std::string(f.patch_embed) + ".weight");
  if (f.patch_bias) out["patch_embed.proj.bias"] = t.take_as(std::string(f.patch_embed) + ".bias", {d});
  TensorData cls;
  if (f.cls_token) cls = t.take_as(f.cls_token, {1, 1, d});
  if (f.dist_token) out["dist_token"] = t.take_as(f.dist_token, {1, 1, d});
  if (!f.pos_embed) {  // DINOv3: cat(cls, registers, patches), positions rotary only
    if (c.register_tokens > 0) out["reg_token"] = t.take_as("embeddings.register_tokens", {1, c.register_tokens, d});
    out["cls_token"] = std::move(cls);
    return;
  }
  const int64_t rows = (f.cls_token ? 1 : 0) + (f.dist_token ? 1 : 0) + patches;
  const TensorData& pos = t.peek(f.pos_embed);  // (1, rows, D), or (rows, D) as CLIP's nn.Embedding
  if (pos.shape.size() < 2 || pos.shape.size() > 3 || pos.shape[pos.shape.size() - 2] != rows)
    throw Error(t.what + ": config.json image_size " + std::to_string(c.img_h) + " gives " + std::to_string(patches) + " patches, but " +
                f.pos_embed + " has shape " + shape_text(pos.shape));
  TensorData pos_embed = t.take_as(f.pos_embed, {1, rows, d});
  if (c.register_tokens > 0) {
    // Dinov2WithRegistersEmbeddings: cat(cls, patches) + pos, then the registers inserted after
    // the class token without a positional row. As timm's _convert_dinov2: cls + pos[0] folded
    // into the class token (the same float sum the forward would make), pos[1:] for the patches
    // only (no_embed_class).
    out["reg_token"] = t.take_as("embeddings.register_tokens", {1, c.register_tokens, d});
    for (int64_t k = 0; k < d; ++k) cls.values[static_cast<size_t>(k)] += pos_embed.values[static_cast<size_t>(k)];
    pos_embed.values.erase(pos_embed.values.begin(), pos_embed.values.begin() + d);
    pos_embed.shape = {1, patches, d};
    c.pos_embed_prefix = false;
  }
  if (f.cls_token) out["cls_token"] = std::move(cls);
  out["pos_embed"] = std::move(pos_embed);
  if (f.norm_pre) {
    out["norm_pre.weight"] = t.take_as(std::string(f.norm_pre) + ".weight", {d});
    out["norm_pre.bias"] = t.take_as(std::string(f.norm_pre) + ".bias", {d});
  }
}

void hf_blocks(Tensors& t, const HfFamily& f, const HfBlockNames& n, const VitConfig& c, TensorMap& out) {
  const int64_t d = c.embed_dim, hm = c.mlp_hidden();
  for (int i = 0; i < c.depth; ++i) {
    const std::string src = std::string(n.layers) + "." + std::to_string(i) + ".";
    const std::string dst = "blocks." + std::to_string(i) + ".";
    auto move = [&](const std::string& from, const std::string& to, const std::vector<int64_t>& shape) {
      out[dst + to] = t.take_as(src + from, shape);
    };
    // A bias the family's config may leave out (optional_biases): zeros, the same sums.
    auto bias = [&](const std::string& name, int64_t size) {
      if (f.optional_biases && !t.has(name)) {
        TensorData zero;
        zero.shape = {size};
        zero.values.assign(static_cast<size_t>(size), 0.0f);
        return zero;
      }
      return t.take_as(name, {size});
    };
    move(std::string(n.norm1) + ".weight", "norm1.weight", {d});
    move(std::string(n.norm1) + ".bias", "norm1.bias", {d});
    // Separate q, k, v Linear(D, D) -> timm's fused qkv (3D, D); head h is rows h*d..h*d+d-1 of
    // each, as transpose_for_scores splits them, which is the order timm's reshape reads.
    std::vector<TensorData> w, b;
    for (const char* part : {n.q, n.k, n.v}) {
      w.push_back(t.take_as(src + part + ".weight", {d, d}));
      if (c.qkv_bias) b.push_back(bias(src + part + ".bias", d));
    }
    out[dst + "attn.qkv.weight"] = stack_rows(w);
    if (c.qkv_bias) out[dst + "attn.qkv.bias"] = stack_rows(b);
    move(std::string(n.proj) + ".weight", "attn.proj.weight", {d, d});
    out[dst + "attn.proj.bias"] = bias(src + n.proj + ".bias", d);
    move(std::string(n.norm2) + ".weight", "norm2.weight", {d});
    move(std::string(n.norm2) + ".bias", "norm2.bias", {d});
    if (c.swiglu && n.fc1_gated) {
      move(std::string(n.fc1) + ".weight", "mlp.fc1.weight", {2 * hm, d});
      out[dst + "mlp.fc1.bias"] = bias(src + n.fc1 + ".bias", 2 * hm);
    } else if (c.swiglu) {  // rows [gate | value], as vitlens' gated MLP reads fc1
      out[dst + "mlp.fc1.weight"] =
          stack_rows({t.take_as(src + n.fc1_gate + ".weight", {hm, d}), t.take_as(src + n.fc1 + ".weight", {hm, d})});
      out[dst + "mlp.fc1.bias"] = stack_rows({bias(src + n.fc1_gate + ".bias", hm), bias(src + n.fc1 + ".bias", hm)});
    } else {
      move(std::string(n.fc1) + ".weight", "mlp.fc1.weight", {hm, d});
      out[dst + "mlp.fc1.bias"] = bias(src + n.fc1 + ".bias", hm);
    }
    move(std::string(n.fc2) + ".weight", "mlp.fc2.weight", {d, hm});
    out[dst + "mlp.fc2.bias"] = bias(src + n.fc2 + ".bias", d);
    if (c.layer_scale) {
      move(n.ls1, "ls1.gamma", {d});
      move(n.ls2, "ls2.gamma", {d});
    }
  }
}

// SigLIP's SiglipMultiheadAttentionPoolingHead in timm's AttentionPoolLatent names: the probe is
// the latent; nn.MultiheadAttention's in_proj (3D, D) packs [W_q | W_k | W_v] by rows, so its
// first D rows are timm's q and the other 2D its kv ([K heads | V heads], the order timm's
// reshape(B, N, 2, H, d) reads); out_proj is proj, layernorm is norm.
void hf_attention_pool(Tensors& t, const std::string& head, const VitConfig& c, TensorMap& out) {
  const int64_t d = c.embed_dim, hm = c.mlp_hidden();
  auto split_rows = [](const TensorData& packed, int64_t first, int64_t rows, int64_t cols) {
    TensorData part;
    part.shape = cols > 0 ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
    const int64_t width = cols > 0 ? cols : 1;
    part.values.assign(packed.values.begin() + first * width, packed.values.begin() + (first + rows) * width);
    return part;
  };
  const std::string h = head + ".";
  out["attn_pool.latent"] = t.take_as(h + "probe", {1, 1, d});
  const TensorData in_w = t.take_as(h + "attention.in_proj_weight", {3 * d, d});
  const TensorData in_b = t.take_as(h + "attention.in_proj_bias", {3 * d});
  out["attn_pool.q.weight"] = split_rows(in_w, 0, d, d);
  out["attn_pool.kv.weight"] = split_rows(in_w, d, 2 * d, d);
  out["attn_pool.q.bias"] = split_rows(in_b, 0, d, 0);
  out["attn_pool.kv.bias"] = split_rows(in_b, d, 2 * d, 0);
  out["attn_pool.proj.weight"] = t.take_as(h + "attention.out_proj.weight", {d, d});
  out["attn_pool.proj.bias"] = t.take_as(h + "attention.out_proj.bias", {d});
  out["attn_pool.norm.weight"] = t.take_as(h + "layernorm.weight", {d});
  out["attn_pool.norm.bias"] = t.take_as(h + "layernorm.bias", {d});
  out["attn_pool.mlp.fc1.weight"] = t.take_as(h + "mlp.fc1.weight", {hm, d});
  out["attn_pool.mlp.fc1.bias"] = t.take_as(h + "mlp.fc1.bias", {hm});
  out["attn_pool.mlp.fc2.weight"] = t.take_as(h + "mlp.fc2.weight", {d, hm});
  out["attn_pool.mlp.fc2.bias"] = t.take_as(h + "mlp.fc2.bias", {d});
}

// Hugging Face's id2label ({"0": "cat", ...}): the names when every class has one.
void hf_class_names(const json& cfg, int classes, ConvertedModel& m) {
  if (!cfg.contains("id2label") || !cfg["id2label"].is_object()) return;
  const json& labels = cfg["id2label"];
  std::vector<std::string> names;
  for (int k = 0; k < classes; ++k) {
    const std::string key = std::to_string(k);
    if (!labels.contains(key) || !labels[key].is_string()) {
      m.notes.push_back("config.json id2label does not name each of the " + std::to_string(classes) + " classes: not used");
      return;
    }
    names.push_back(labels[key].get<std::string>());
  }
  m.class_names = std::move(names);
  m.class_names_source = "config.json id2label";
}

// After the blocks: the final norm; a (C, D) classifier on the class token read as timm's head
// (ViTForImageClassification, DeiTForImageClassification: "classifier"; DeiT's WithTeacher:
// "cls_classifier" with "distillation_classifier" on the distillation token, read as timm's
// head_dist, the two averaged as transformers does); the pooled-only parts dropped with a note;
// anything left was not mapped and is refused.
void hf_after_blocks(Tensors& t, const HfFamily& f, const json& cfg, ConvertedModel& m, TensorMap& out) {
  const VitConfig& c = m.config;
  const int64_t d = c.embed_dim;
  if (f.norm) {
    out["norm.weight"] = t.take_as(std::string(f.norm) + ".weight", {d});
    out["norm.bias"] = t.take_as(std::string(f.norm) + ".bias", {d});
  }
  // Dinov2's classifier reads the class token and the patch mean (C, 2D): not a head vitlens has.
  auto is_head = [&](const std::string& name) {
    if (!t.has(name + ".weight") || !t.has(name + ".bias")) return false;
    const TensorData& w = t.peek(name + ".weight");
    return w.shape.size() == 2 && w.shape[1] == d && t.peek(name + ".bias").shape == std::vector<int64_t>{w.shape[0]};
  };
  for (const char* name : {f.classifier, "classifier"}) {
    if (!f.classifier || !name || !is_head(name)) continue;
    const int64_t classes = t.peek(std::string(name) + ".weight").shape[0];
    out["head.weight"] = t.take(std::string(name) + ".weight");
    out["head.bias"] = t.take(std::string(name) + ".bias");
    if (c.dist_token && is_head("distillation_classifier") && t.peek("distillation_classifier.weight").shape[0] == classes) {
      out["head_dist.weight"] = t.take("distillation_classifier.weight");
      out["head_dist.bias"] = t.take("distillation_classifier.bias");
    }
    m.config.head_pool = HeadPool::Token;
    hf_class_names(cfg, static_cast<int>(classes), m);
    break;
  }
  if (c.attention_pool) hf_attention_pool(t, f.attention_pool, c, out);
  for (const auto& [prefix, note] : kHfPooledOnly)
    if (t.drop_prefix(prefix) && note) m.notes.push_back(note);
  if (!t.map.empty())
    throw Error(t.what + ": tensor '" + t.map.begin()->first + "' is not part of a Hugging Face " + f.model_type +
                " model as vitlens maps it; vitlens would ignore it");
}

// mean/std: preprocessor_config.json when it is there, else the family's usual values.
void hf_mean_std(const std::string& folder, const HfFamily& f, ConvertedModel& m, const std::string& what) {
  VitConfig& c = m.config;
  const std::string pre_path = folder + "/preprocessor_config.json";
  if (is_file(pre_path)) {
    const json pre = read_json(pre_path, what);
    if (json_rgb(pre, "image_mean", c.mean) && json_rgb(pre, "image_std", c.std)) return;
  }
  c.mean = f.mean;
  c.std = f.std;
  m.notes.push_back(std::string("mean/std: no preprocessor_config.json, so ") + f.model_type + "'s usual values are used");
}

}  // namespace

using namespace layout_support;

ConvertedModel convert_hf(layout_support::Tensors t, const std::string& folder, const LoadOptions& options) {
  ConvertedModel m;
  json cfg;
  const HfFamily& f = read_hf_config(t, folder, cfg, m.notes);
  m.format = f.format;
  t.strip_prefix(f.prefix);
  read_hf_options(cfg, f, options, m.config, t.what);
  check_hf_shapes(t, f, m.config);
  TensorMap out;
  hf_embeddings(t, f, m.config, out);
  const bool dinov2 = std::string(f.format) == "hf-dinov2";
  const HfBlockNames& names = m.config.swiglu && dinov2 ? kHfDinov2SwigluBlock : *f.block;
  if (m.config.swiglu && !names.fc1_gate && !names.fc1_gated)
    throw Error(t.what + ": unsupported model: config.json asks for a gated MLP in a " + f.model_type + " model");
  const std::string first_fc1 = std::string(names.layers) + ".0." + (names.fc1_gate ? names.fc1_gate : names.fc1) + ".weight";
  if (m.config.swiglu && !t.has(first_fc1))
    throw Error(t.what + ": config.json asks for a SwiGLU MLP (use_swiglu_ffn / use_gated_mlp) but tensor '" + first_fc1 +
                "' is missing");
  hf_blocks(t, f, names, m.config, out);
  hf_after_blocks(t, f, cfg, m, out);
  hf_mean_std(folder, f, m, t.what);
  const VitConfig& c = m.config;
  if (c.rope != Rope::None)
    m.notes.push_back("rotary position embeddings (" + std::string(rope_name(c.rope)) + ", rope_theta " +
                      std::to_string(c.rope_temperature) + ", rotate-half pairs) on the patch tokens' queries and keys, " +
                      "computed for each image's own grid; no position table");
  if (c.swiglu)
    m.notes.push_back("gated MLP read as SwiGLU: fc2(silu(gate_proj x) * up_proj x), hidden width " + std::to_string(c.mlp_hidden()));
  m.tensors = std::move(out);
  return m;
}


}  // namespace vitlens
