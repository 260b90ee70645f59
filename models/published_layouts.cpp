// timm and Hugging Face checkpoints onto vitlens' block (see published_layouts.hpp): tables of
// names and options per layout, q/k/v fused into timm's (3D, D) qkv, and the options read from
// the tensors and the companion config.json (read_timm_config, read_hf_config; preprocessor
// values from pretrained_cfg and preprocessor_config.json).
#include "models/published_layouts.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "models/json_file.hpp"

namespace vitlens {

namespace {

using nlohmann::json;

// [SECTION] Small helpers

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A companion file's strings are names (architecture, model_type, hidden_act, _name_or_path,
// labels): each is cut to a model name's length as it is read, so none of megabytes travels on.
json read_json(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(what + ": cannot read its companion file " + path);
  std::ostringstream text;
  text << in.rdbuf();
  json j = parse_json_text(text.str(), what + ": companion file " + path, kMaxModelNameBytes);
  if (!j.is_object()) throw Error(what + ": companion file " + path + " is not a JSON object");
  return j;
}

int json_int(const json& j, const char* key, const std::string& what, const std::string& file) {
  if (!j.contains(key)) throw Error(what + ": " + file + " has no '" + key + "'");
  const json& v = j.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1000000)
    throw Error(what + ": " + file + " key '" + key + "' is not a non-negative integer");
  return static_cast<int>(v.get<int64_t>());
}

double json_number(const json& j, const char* key, double fallback, const std::string& what, const std::string& file) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  if (!j.at(key).is_number()) throw Error(what + ": " + file + " key '" + key + "' is not a number");
  return j.at(key).get<double>();
}

bool json_bool(const json& j, const char* key, bool fallback, const std::string& what, const std::string& file) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  if (!j.at(key).is_boolean()) throw Error(what + ": " + file + " key '" + key + "' is not true or false");
  return j.at(key).get<bool>();
}

bool json_rgb(const json& j, const char* key, std::array<float, 3>& out) {
  if (!j.contains(key)) return false;
  const json& v = j.at(key);
  if (!v.is_array() || v.size() != 3) return false;
  for (size_t c = 0; c < 3; ++c) {
    if (!v[c].is_number()) return false;
    out[c] = v[c].get<float>();
  }
  return true;
}

// Takes tensors out of a checkpoint by name; what is left at the end was not mapped.
struct Tensors {
  TensorMap map;
  std::string what;

  bool has(const std::string& name) const { return map.count(name) != 0; }
  const TensorData& peek(const std::string& name) const {
    const auto it = map.find(name);
    if (it == map.end()) throw Error(what + ": tensor '" + name + "' is missing");
    return it->second;
  }
  // Checked for NaN here, so a renamed tensor is named as the file names it.
  TensorData take(const std::string& name) {
    const auto it = map.find(name);
    if (it == map.end()) throw Error(what + ": tensor '" + name + "' is missing");
    for (float v : it->second.values)
      if (!std::isfinite(v)) throw Error(what + ": tensor '" + name + "' holds NaN or infinite values");
    TensorData t = std::move(it->second);
    map.erase(it);
    return t;
  }
  // Takes `name` and checks its element count against `shape`, which it then gets (a reshape).
  TensorData take_as(const std::string& name, const std::vector<int64_t>& shape) {
    TensorData t = take(name);
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    if (t.values.size() != n)
      throw Error(what + ": tensor '" + name + "' has shape " + shape_text(t.shape) + ", expected " + shape_text(shape));
    t.shape = shape;
    return t;
  }
  // Drops every tensor whose name starts with `prefix`; true when any was there.
  bool drop_prefix(const std::string& prefix) {
    bool any = false;
    for (auto it = map.begin(); it != map.end();)
      if (starts_with(it->first, prefix)) {
        it = map.erase(it);
        any = true;
      } else {
        ++it;
      }
    return any;
  }
  // Strips `prefix` from every name that has it (e.g. "vit." of ViTForImageClassification).
  void strip_prefix(const std::string& prefix) {
    TensorMap out;
    for (auto& entry : map)
      out.emplace(starts_with(entry.first, prefix) ? entry.first.substr(prefix.size()) : entry.first, std::move(entry.second));
    map = std::move(out);
  }
};

// (out, in) rows of q, k and v stacked into timm's fused (3 out, in): rows [Q heads | K heads | V heads].
TensorData stack_rows(const std::vector<TensorData>& parts) {
  TensorData out;
  out.shape = parts[0].shape;
  out.shape[0] = 0;
  for (const TensorData& p : parts) {
    out.shape[0] += p.shape[0];
    out.values.insert(out.values.end(), p.values.begin(), p.values.end());
  }
  return out;
}

// mlp_ratio so that int(D * ratio) == hidden, as timm computes the MLP width in double.
double mlp_ratio_for(int dim, int hidden) {
  double ratio = static_cast<double>(hidden) / dim;
  while (static_cast<int>(dim * ratio) < hidden) ratio = std::nextafter(ratio, 1e9);
  return ratio;
}

const std::array<float, 3> kImagenetMean{0.485f, 0.456f, 0.406f}, kImagenetStd{0.229f, 0.224f, 0.225f};
const std::array<float, 3> kClipMean{0.48145466f, 0.4578275f, 0.40821073f}, kClipStd{0.26862954f, 0.26130258f, 0.27577711f};

// Patch grid of a positional table with `rows` patch rows, for a square image: 0 when not a square.
int square_side(int64_t rows) {
  if (rows < 1) return 0;
  const auto side = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(rows))));
  return side * side == rows ? static_cast<int>(side) : 0;
}

// The patch embedding's (D, 3, P, P): D and P, or a one-line error.
void read_patch_embed(const TensorData& w, const std::string& name, const std::string& what, int& dim, int& patch) {
  if (w.shape.size() != 4 || w.shape[2] != w.shape[3] || w.shape[0] < 1 || w.shape[2] < 1)
    throw Error(what + ": tensor '" + name + "' has shape " + shape_text(w.shape) + ", expected [D, 3, P, P]");
  if (w.shape[1] != 3)
    throw Error(what + ": tensor '" + name + "' takes " + std::to_string(w.shape[1]) +
                " input channels; vitlens feeds RGB images (3 channels)");
  dim = static_cast<int>(w.shape[0]);
  patch = static_cast<int>(w.shape[2]);
}

// [SECTION] timm

// Tensor names that mean a feature vitlens' block does not compute.
void refuse_timm_features(const Tensors& t) {
  static const std::pair<const char*, const char*> kRefused[] = {
      {".attn.q_norm.", "qk-norm (a LayerNorm on each head's queries and keys)"},
      {".attn.k_norm.", "qk-norm (a LayerNorm on each head's queries and keys)"},
      {".attn.q_bias", "separate q/v biases (BEiT / EVA attention)"},
      {".attn.norm.", "a norm on the attention output (scale_norm)"},
      {".attn.lambda_q1", "differential attention (timm's DiffAttention)"},
      {".mlp.fc1_g.", "a SwiGLU MLP"},
      {".mlp.w12.", "a SwiGLU MLP"},
      {".mlp.fc1_x.", "a SwiGLU MLP"},
      {".mlp.norm.", "a norm inside the MLP"},
      {"relative_position", "relative position biases"},
      {"rel_pos.", "relative position biases (timm's vit_relpos_* / vit_srelpos_*)"},
      {"rope", "rotary position embeddings"},
      {".gamma_1", "an Eva block (timm's Eva: DINOv3, EVA-02) with rotary position embeddings"},
      {".in_proj.", "parallel attention and MLP blocks"},
      {".attns.", "parallel attention and MLP branches (timm's ParallelThingsBlock, vit_*_18x2_*)"},
      {"patch_embed.backbone.", "a hybrid CNN stem"},
      {"patch_embed.norm.", "a norm in the patch embedding"},
      {".attn.gate.", "gated attention"},
      {"attn_pool.", "an attention-pool head (timm global_pool 'map', as SigLIP's)"},
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
  if (!t.has("pos_embed"))
    refuse("it has no position table 'pos_embed' (its positions are rotary or relative, as DINOv3's and vit_relpos_*'s)");
  if (!t.has("blocks.0.norm1.bias")) refuse("blocks.0.norm1 has no bias: an RMSNorm (timm norm_layer 'rmsnorm')");
  if (!t.has("blocks.0.attn.proj.bias")) refuse("blocks.0.attn.proj has no bias (timm proj_bias=False)");
  const std::vector<int64_t>& fc1 = t.peek("blocks.0.mlp.fc1.weight").shape;
  const std::vector<int64_t>& fc2 = t.peek("blocks.0.mlp.fc2.weight").shape;
  if (fc1.size() == 2 && fc2.size() == 2 && fc1[0] == 2 * fc2[1])
    refuse("blocks.0.mlp.fc1 is twice as wide as fc2 reads (" + shape_text(fc1) + " then " + shape_text(fc2) +
           "): a packed SwiGLU MLP (timm SwiGLUPacked, DINOv2 giant)");
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
  if (t.drop_prefix("fc_norm."))
    m.notes.push_back("fc_norm ignored: it norms the pooled vector only; the tokens are shown as they leave the last block");
  c.mlp_ratio = mlp_ratio_for(dim, static_cast<int>(fc1.at(0)));
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
      {"scale_attn_norm", "false", "a norm on the attention output"},
      {"scale_mlp_norm", "false", "a norm inside the MLP"},
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
    throw Error(what + ": unsupported model: config.json model_args." + rule.key + " = " + args[rule.key].dump() + " means " +
                rule.means + ", which vitlens' ViT block does not compute");
  }
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
  if (args.contains("num_heads")) {
    if (!args["num_heads"].is_number_integer() || args["num_heads"].get<int64_t>() < 1 || args["num_heads"].get<int64_t>() > c.embed_dim)
      throw Error(what + ": config.json model_args.num_heads is not an integer in [1, " + std::to_string(c.embed_dim) + "]");
    c.num_heads = static_cast<int>(args["num_heads"].get<int64_t>());
    heads_known = true;
  }
  if (options.heads > 0) {
    if (heads_known && options.heads != c.num_heads)
      throw Error(what + ": --heads " + std::to_string(options.heads) + " contradicts config.json (" + tc.arch + " has " +
                  std::to_string(c.num_heads) + " heads)");
    c.num_heads = options.heads;
    if (!heads_known) m.notes.push_back("num_heads " + std::to_string(options.heads) + " from --heads");
    heads_known = true;
  }
  if (!heads_known)
    throw Error(what + ": the number of attention heads cannot be read from the tensors (width " + std::to_string(c.embed_dim) +
                (tc.arch.empty() ? ", no config.json" : ", architecture '" + tc.arch + "'") + "): pass --heads");
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

// The classifier: timm's head (C, D); DeiT's distillation head dropped; num_classes checked.
void timm_head(Tensors& t, const TimmConfig& tc, ConvertedModel& m) {
  if (t.drop_prefix("head_dist.")) m.notes.push_back("head_dist (DeiT's distillation classifier) ignored");
  if (!tc.cfg.contains("num_classes") || !tc.cfg["num_classes"].is_number_integer()) return;
  const int64_t classes = tc.cfg["num_classes"].get<int64_t>();
  const int64_t in_file = t.has("head.weight") ? t.peek("head.weight").shape.at(0) : 0;
  if (classes != in_file)
    throw Error(t.what + ": config.json num_classes is " + std::to_string(classes) + " but head.weight has " +
                std::to_string(in_file) + " rows");
}

ConvertedModel convert_timm(Tensors t, const std::string& folder, const LoadOptions& options) {
  const std::string& what = t.what;
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
  check_args_against_tensors(tc.args, c, what);
  read_timm_activation(tc.args, c, what);
  read_timm_heads(tc, options, heads_known, m, what);
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

}  // namespace

void timm_architecture_options(const std::string& arch, int embed_dim, VitConfig& c, bool& heads_known,
                               const std::string& what) {
  const std::string base = arch.substr(0, arch.find('.'));
  if (!starts_with(base, "vit_") && !starts_with(base, "deit_") && !starts_with(base, "deit3_"))
    throw Error(what + ": unsupported model: timm architecture '" + arch +
                "' is not a VisionTransformer family vitlens maps (vit_*, deit_*, deit3_*; see README, Supported models)");
  // Families whose entrypoint changes the computation; most also show it in their tensor names,
  // which refuse_timm_features names when there is no config.json.
  static const std::pair<const char*, const char*> kRefused[] = {
      {"rope", "it uses rotary position embeddings"},
      {"dinov3", "it is DINOv3 (timm's Eva block with rotary position embeddings)"},
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
  };
  for (const auto& h : kHeads)
    if (contains(base + "_", h.size) && embed_dim == h.dim) {
      c.num_heads = h.heads;
      heads_known = true;
    }
}

namespace {

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
};

constexpr HfBlockNames kHfVitBlock{"encoder.layer", "layernorm_before", "attention.attention.query", "attention.attention.key",
                                   "attention.attention.value", "attention.output.dense", nullptr, "layernorm_after",
                                   "intermediate.dense", "output.dense", nullptr};
constexpr HfBlockNames kHfDinov2Block{"encoder.layer", "norm1", "attention.attention.query", "attention.attention.key",
                                      "attention.attention.value", "attention.output.dense", "layer_scale1.lambda1", "norm2",
                                      "mlp.fc1", "mlp.fc2", "layer_scale2.lambda1"};
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
};

const std::array<float, 3> kHalf{0.5f, 0.5f, 0.5f};
const HfFamily kHfFamilies[] = {
    {"vit", "hf-vit", "vit.", &kHfVitBlock, "embeddings.patch_embeddings.projection", true, "embeddings.cls_token", nullptr,
     "embeddings.position_embeddings", nullptr, "layernorm", "classifier", "intermediate_size", true, 1e-12, kHalf, kHalf},
    {"deit", "hf-deit", "deit.", &kHfVitBlock, "embeddings.patch_embeddings.projection", true, "embeddings.cls_token",
     "embeddings.distillation_token", "embeddings.position_embeddings", nullptr, "layernorm", "cls_classifier",
     "intermediate_size", true, 1e-12, kImagenetMean, kImagenetStd},
    {"dinov2", "hf-dinov2", "dinov2.", &kHfDinov2Block, "embeddings.patch_embeddings.projection", true, "embeddings.cls_token",
     nullptr, "embeddings.position_embeddings", nullptr, "layernorm", nullptr, nullptr, true, 1e-12, kImagenetMean, kImagenetStd},
    {"dinov2_with_registers", "hf-dinov2", "dinov2_with_registers.", &kHfDinov2Block, "embeddings.patch_embeddings.projection",
     true, "embeddings.cls_token", nullptr, "embeddings.position_embeddings", nullptr, "layernorm", nullptr, nullptr, true, 1e-12,
     kImagenetMean, kImagenetStd},
    {"clip_vision_model", "hf-clip", "vision_model.", &kHfClipBlock, "embeddings.patch_embedding", false,
     "embeddings.class_embedding", nullptr, "embeddings.position_embedding.weight", "pre_layrnorm", nullptr, nullptr,
     "intermediate_size", false, 1e-5, kClipMean, kClipStd},
};

// Parts of a file that act after the tokens vitlens shows (pooled vectors, task heads): dropped,
// each with its note.
const std::pair<const char*, const char*> kHfPooledOnly[] = {
    {"pooler.", "pooler ignored (a dense + tanh on the class token, after the tokens shown)"},
    {"post_layernorm.", "post_layernorm ignored: it norms the pooled class token only; the tokens are shown as they leave the last block"},
    {"visual_projection.", "visual_projection ignored (it maps the pooled vector into CLIP's joint space)"},
    {"distillation_classifier.", "distillation_classifier (DeiT's distillation head) ignored"},
    {"classifier.", "classifier ignored"},
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
  for (const HfFamily& f : kHfFamilies)
    if (type == f.model_type) return f;
  throw Error(what + ": unsupported model: Hugging Face model_type '" + type +
              "'; vitlens maps vit, deit, dinov2, dinov2_with_registers, clip_vision_model and clip (see README, Supported models)");
}

// The config's numbers, as the family reads them.
void read_hf_options(const json& cfg, const HfFamily& f, const LoadOptions& options, VitConfig& c, const std::string& what) {
  const std::string file = "config.json";
  if (json_bool(cfg, "use_swiglu_ffn", false, what, file))
    throw Error(what + ": unsupported model: config.json use_swiglu_ffn is true (DINOv2 giant's SwiGLU MLP), which vitlens' block does not compute");
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
  c.act = hf_activation(cfg, what);
  c.qkv_bias = f.qkv_bias_key ? json_bool(cfg, "qkv_bias", true, what, file) : true;
  c.mlp_ratio = f.mlp_width_key ? mlp_ratio_for(c.embed_dim, json_int(cfg, f.mlp_width_key, what, file))
                                : json_number(cfg, "mlp_ratio", 4.0, what, file);
  c.layer_scale = f.block->ls1 != nullptr;
  c.patch_bias = f.patch_bias;
  c.dist_token = f.dist_token != nullptr;
  c.pre_norm = f.norm_pre != nullptr;
  c.final_norm = f.norm != nullptr;
  if (std::string(f.model_type) == "dinov2_with_registers") c.register_tokens = json_int(cfg, "num_register_tokens", what, file);
  const std::string type = f.model_type;
  c.name = cfg.contains("_name_or_path") && cfg["_name_or_path"].is_string() && !cfg["_name_or_path"].get<std::string>().empty()
               ? cfg["_name_or_path"].get<std::string>()
               : type;
  c.description = "Hugging Face " + type;
  const std::string why = c.validate();
  if (!why.empty()) throw Error(what + ": config.json: " + why);
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
  TensorData cls = t.take_as(f.cls_token, {1, 1, d});
  if (f.dist_token) out["dist_token"] = t.take_as(f.dist_token, {1, 1, d});
  const int64_t rows = 1 + (f.dist_token ? 1 : 0) + patches;
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
  out["cls_token"] = std::move(cls);
  out["pos_embed"] = std::move(pos_embed);
  if (f.norm_pre) {
    out["norm_pre.weight"] = t.take_as(std::string(f.norm_pre) + ".weight", {d});
    out["norm_pre.bias"] = t.take_as(std::string(f.norm_pre) + ".bias", {d});
  }
}

void hf_blocks(Tensors& t, const HfBlockNames& n, const VitConfig& c, TensorMap& out) {
  const int64_t d = c.embed_dim, hm = c.mlp_hidden();
  for (int i = 0; i < c.depth; ++i) {
    const std::string src = std::string(n.layers) + "." + std::to_string(i) + ".";
    const std::string dst = "blocks." + std::to_string(i) + ".";
    auto move = [&](const std::string& from, const std::string& to, const std::vector<int64_t>& shape) {
      out[dst + to] = t.take_as(src + from, shape);
    };
    move(std::string(n.norm1) + ".weight", "norm1.weight", {d});
    move(std::string(n.norm1) + ".bias", "norm1.bias", {d});
    // Separate q, k, v Linear(D, D) -> timm's fused qkv (3D, D); head h is rows h*d..h*d+d-1 of
    // each, as transpose_for_scores splits them, which is the order timm's reshape reads.
    std::vector<TensorData> w, b;
    for (const char* part : {n.q, n.k, n.v}) {
      w.push_back(t.take_as(src + part + ".weight", {d, d}));
      if (c.qkv_bias) b.push_back(t.take_as(src + part + ".bias", {d}));
    }
    out[dst + "attn.qkv.weight"] = stack_rows(w);
    if (c.qkv_bias) out[dst + "attn.qkv.bias"] = stack_rows(b);
    move(std::string(n.proj) + ".weight", "attn.proj.weight", {d, d});
    move(std::string(n.proj) + ".bias", "attn.proj.bias", {d});
    move(std::string(n.norm2) + ".weight", "norm2.weight", {d});
    move(std::string(n.norm2) + ".bias", "norm2.bias", {d});
    move(std::string(n.fc1) + ".weight", "mlp.fc1.weight", {hm, d});
    move(std::string(n.fc1) + ".bias", "mlp.fc1.bias", {hm});
    move(std::string(n.fc2) + ".weight", "mlp.fc2.weight", {d, hm});
    move(std::string(n.fc2) + ".bias", "mlp.fc2.bias", {d});
    if (c.layer_scale) {
      move(n.ls1, "ls1.gamma", {d});
      move(n.ls2, "ls2.gamma", {d});
    }
  }
}

// After the blocks: the final norm, a (C, D) classifier as timm's head, the pooled-only parts
// dropped with a note; anything left was not mapped and is refused.
void hf_after_blocks(Tensors& t, const HfFamily& f, const VitConfig& c, TensorMap& out, std::vector<std::string>& notes) {
  const int64_t d = c.embed_dim;
  if (f.norm) {
    out["norm.weight"] = t.take_as(std::string(f.norm) + ".weight", {d});
    out["norm.bias"] = t.take_as(std::string(f.norm) + ".bias", {d});
  }
  // Dinov2's classifier reads the class token and the patch mean (C, 2D): not a head vitlens has.
  const std::string head = f.classifier ? f.classifier : "";
  if (!head.empty() && t.has(head + ".weight") && t.has(head + ".bias")) {
    const TensorData& w = t.peek(head + ".weight");
    if (w.shape.size() == 2 && w.shape[1] == d) {
      out["head.weight"] = t.take(head + ".weight");
      out["head.bias"] = t.take(head + ".bias");
    }
  }
  for (const auto& [prefix, note] : kHfPooledOnly)
    if (t.drop_prefix(prefix) && note) notes.push_back(note);
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

ConvertedModel convert_hf(Tensors t, const std::string& folder, const LoadOptions& options) {
  ConvertedModel m;
  json cfg;
  const HfFamily& f = read_hf_config(t, folder, cfg, m.notes);
  m.format = f.format;
  t.strip_prefix(f.prefix);
  read_hf_options(cfg, f, options, m.config, t.what);
  check_hf_shapes(t, f, m.config);
  TensorMap out;
  hf_embeddings(t, f, m.config, out);
  hf_blocks(t, *f.block, m.config, out);
  hf_after_blocks(t, f, m.config, out, m.notes);
  hf_mean_std(folder, f, m, t.what);
  m.tensors = std::move(out);
  return m;
}

}  // namespace

ConvertedModel convert_checkpoint(TensorMap tensors, const std::string& path, const std::string& folder,
                                  const LoadOptions& options) {
  Tensors t{std::move(tensors), path};
  auto any_starts = [&](const std::vector<std::string>& prefixes) {
    for (const auto& entry : t.map)
      for (const std::string& p : prefixes)
        if (starts_with(entry.first, p)) return true;
    return false;
  };
  if (t.has("patch_embed.proj.weight")) return convert_timm(std::move(t), folder, options);
  if (any_starts({"embeddings.patch_embeddings.", "vit.embeddings.", "deit.embeddings.", "dinov2.embeddings.",
                  "dinov2_with_registers.embeddings.", "vision_model.embeddings.", "embeddings.patch_embedding."}))
    return convert_hf(std::move(t), folder, options);
  if (any_starts({"timm_model."}))
    throw Error(path + ": unsupported model: a transformers TimmWrapper file (tensors 'timm_model.*'); vitlens reads the timm "
                "model's own files (model.safetensors + config.json as timm saves them, e.g. on the hub under timm/)");
  if (any_starts({"visual.", "model.visual."}))
    throw Error(path + ": unsupported model: an OpenAI / open_clip checkpoint (visual.*); timm's vit_*_clip_* or Hugging Face CLIPVisionModel files open");
  const std::string first = t.map.empty() ? std::string("(no tensors)") : t.map.begin()->first;
  throw Error(path + ": no vitlens config in __metadata__ and the tensor names (first: '" + first +
              "') match neither timm's VisionTransformer nor a Hugging Face ViT, DeiT, Dinov2 or CLIP vision model (see README, Supported models)");
}

}  // namespace vitlens
