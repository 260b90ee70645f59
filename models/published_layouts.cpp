// timm and Hugging Face checkpoints onto vitlens' block (see checkpoints.hpp): a name map per
// layout, q/k/v fused into timm's (3D, D) qkv, and the options read from the tensors and the
// companion config.json.
#include "models/published_layouts.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include <sys/stat.h>

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
  TensorData take(const std::string& name) {
    const auto it = map.find(name);
    if (it == map.end()) throw Error(what + ": tensor '" + name + "' is missing");
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

// Features of timm models that vitlens' block does not compute, found by tensor name.
void refuse_timm_features(const Tensors& t) {
  static const std::pair<const char*, const char*> kRefused[] = {
      {".attn.q_norm.", "qk-norm (a LayerNorm on each head's queries and keys)"},
      {".attn.k_norm.", "qk-norm (a LayerNorm on each head's queries and keys)"},
      {".attn.q_bias", "separate q/v biases (BEiT / EVA attention)"},
      {".attn.norm.", "a norm on the attention output (scale_norm)"},
      {".mlp.fc1_g.", "a SwiGLU MLP"},
      {".mlp.w12.", "a SwiGLU MLP"},
      {".mlp.fc1_x.", "a SwiGLU MLP"},
      {".mlp.norm.", "a norm inside the MLP"},
      {"relative_position", "relative position biases"},
      {"rope", "rotary position embeddings"},
      {".in_proj.", "parallel attention and MLP blocks"},
      {"patch_embed.backbone.", "a hybrid CNN stem"},
      {".attn.gate.", "gated attention"},
  };
  for (const auto& entry : t.map)
    for (const auto& [part, why] : kRefused)
      if (contains(entry.first, part))
        throw Error(t.what + ": unsupported model: tensor '" + entry.first + "' means " + why +
                    ", which vitlens' ViT block does not compute (see README, Supported models)");
}

}  // namespace

void timm_architecture_options(const std::string& arch, int embed_dim, VitConfig& c, bool& heads_known,
                               const std::string& what) {
  const std::string base = arch.substr(0, arch.find('.'));
  if (!starts_with(base, "vit_") && !starts_with(base, "deit_") && !starts_with(base, "deit3_"))
    throw Error(what + ": unsupported model: timm architecture '" + arch +
                "' is not a VisionTransformer family vitlens maps (vit_*, deit_*, deit3_*; see README, Supported models)");
  static const std::pair<const char*, const char*> kRefused[] = {
      {"siglip", "its SigLIP tower uses tanh GELU and an attention-pool head that vitlens has no parity test for"},
      {"rope", "it uses rotary position embeddings"},
      {"_xp_", "it uses parallel blocks"},
      {"naflex", "it uses NaFlex variable-resolution patches"},
      {"resnet", "it has a CNN stem"},
      {"_parallel_", "it uses parallel blocks"},
      {"_pe_", "it is a Perception Encoder tower with rotary embeddings"},
  };
  for (const auto& [part, why] : kRefused)
    if (contains(base, part))
      throw Error(what + ": unsupported model: timm architecture '" + arch + "' is refused because " + why);
  // timm's CLIP towers: LayerNorm eps 1e-5 (open_clip); the OpenAI ones use quick-GELU.
  if (contains(base, "_clip_")) c.norm_eps = 1e-5f;
  if (contains(base, "quickgelu")) c.act = Activation::QuickGelu;
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

ConvertedModel convert_timm(Tensors t, const std::string& folder, const LoadOptions& options) {
  const std::string& what = t.what;
  refuse_timm_features(t);
  ConvertedModel m;
  m.format = "timm";
  VitConfig& c = m.config;
  auto note = [&](const std::string& s) { m.notes.push_back(s); };

  const std::string config_path = folder + "/config.json";
  const bool have_config = is_file(config_path);
  json cfg = json::object(), args = json::object(), pre = json::object();
  if (have_config) {
    cfg = read_json(config_path, what);
    if (cfg.contains("model_args") && cfg["model_args"].is_object()) args = cfg["model_args"];
    if (cfg.contains("pretrained_cfg") && cfg["pretrained_cfg"].is_object()) pre = cfg["pretrained_cfg"];
  }
  const std::string cfg_name = "config.json";
  const std::string arch = cfg.contains("architecture") && cfg["architecture"].is_string()
                               ? cfg["architecture"].get<std::string>() : "";

  // Shapes the tensors fix.
  int dim = 0, patch = 0;
  read_patch_embed(t.peek("patch_embed.proj.weight"), "patch_embed.proj.weight", what, dim, patch);
  c.embed_dim = dim;
  c.patch_size = patch;
  int depth = 0;
  while (t.has("blocks." + std::to_string(depth) + ".norm1.weight")) ++depth;
  if (depth == 0) throw Error(what + ": timm layout without 'blocks.0.norm1.weight': no transformer blocks found");
  c.depth = depth;
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
    note("fc_norm ignored: it norms the pooled vector only; the tokens are shown as they leave the last block");
  const int hidden = static_cast<int>(t.peek("blocks.0.mlp.fc1.weight").shape.at(0));
  c.mlp_ratio = mlp_ratio_for(dim, hidden);
  c.norm_eps = 1e-6f;  // timm's VisionTransformer default (partial(nn.LayerNorm, eps=1e-6))
  c.mean = {0.5f, 0.5f, 0.5f};
  c.std = {0.5f, 0.5f, 0.5f};
  c.name = arch.empty() ? capped_text(what.substr(what.find_last_of('/') + 1), kMaxModelNameBytes) : arch;
  c.description = arch.empty() ? "timm layout, architecture inferred from the tensors" : "timm " + arch;

  // What only the names or the config say.
  bool heads_known = false;
  if (!arch.empty()) timm_architecture_options(arch, dim, c, heads_known, what);
  if (contains(arch, "_clip_") && contains(arch, ".openai") && !contains(arch, "quickgelu"))
    note("GELU as timm runs '" + arch + "'; the original OpenAI CLIP uses quick-GELU (timm's *_clip_quickgelu_* name)");
  auto args_int = [&](const char* key, int tensor_value, const char* from) {
    if (!args.contains(key)) return;
    const json& v = args[key];
    if (!v.is_number_integer() || v.get<int64_t>() != tensor_value)
      throw Error(what + ": config.json model_args." + key + " is " + v.dump() + " but " + from + " says " +
                  std::to_string(tensor_value));
  };
  args_int("embed_dim", dim, "patch_embed.proj.weight");
  args_int("patch_size", patch, "patch_embed.proj.weight");
  args_int("depth", depth, "the blocks.* tensors");
  args_int("reg_tokens", c.register_tokens, "reg_token");
  auto args_bool = [&](const char* key, bool tensor_value, const char* from) {
    if (!args.contains(key)) return;
    if (!args[key].is_boolean() || args[key].get<bool>() != tensor_value)
      throw Error(what + ": config.json model_args." + key + " is " + args[key].dump() + " but the tensors say " +
                  (tensor_value ? "true" : "false") + " (" + from + ")");
  };
  args_bool("class_token", c.class_token, "cls_token");
  args_bool("qkv_bias", c.qkv_bias, "blocks.0.attn.qkv.bias");
  args_bool("pre_norm", c.pre_norm, "norm_pre.weight");
  for (const char* key : {"qk_norm", "scale_attn_norm", "scale_mlp_norm"})
    if (args.contains(key) && args[key].is_boolean() && args[key].get<bool>())
      throw Error(what + ": unsupported model: config.json model_args." + key + " is true; vitlens' ViT block has no such norm");
  for (const char* key : {"mlp_layer", "block_fn", "attn_layer", "embed_layer"})
    if (args.contains(key) && !args[key].is_null())
      throw Error(what + ": unsupported model: config.json model_args." + key + " = " + args[key].dump() +
                  " replaces a part of timm's standard ViT block");
  if (args.contains("act_layer") && !args["act_layer"].is_null()) {
    const std::string act = args["act_layer"].is_string() ? args["act_layer"].get<std::string>() : args["act_layer"].dump();
    if (act == "gelu") c.act = Activation::Gelu;
    else if (act == "gelu_tanh") c.act = Activation::GeluTanh;
    else if (act == "quick_gelu") c.act = Activation::QuickGelu;
    else throw Error(what + ": unsupported model: config.json model_args.act_layer '" + act + "'; vitlens computes gelu, gelu_tanh and quick_gelu");
  }
  if (args.contains("num_heads")) {
    if (!args["num_heads"].is_number_integer() || args["num_heads"].get<int64_t>() < 1 || args["num_heads"].get<int64_t>() > dim)
      throw Error(what + ": config.json model_args.num_heads is not an integer in [1, " + std::to_string(dim) + "]");
    c.num_heads = static_cast<int>(args["num_heads"].get<int64_t>());
    heads_known = true;
  }
  if (options.heads > 0) {
    if (heads_known && options.heads != c.num_heads)
      throw Error(what + ": --heads " + std::to_string(options.heads) + " contradicts config.json (" + arch + " has " +
                  std::to_string(c.num_heads) + " heads)");
    c.num_heads = options.heads;
    if (!heads_known) note("num_heads " + std::to_string(options.heads) + " from --heads");
    heads_known = true;
  }
  if (!heads_known)
    throw Error(what + ": the number of attention heads cannot be read from the tensors (width " + std::to_string(dim) +
                (arch.empty() ? ", no config.json" : ", architecture '" + arch + "'") + "): pass --heads");

  // Image size and whether the positional table covers the prefix tokens (no_embed_class).
  const TensorData& pos = t.peek("pos_embed");
  if (pos.shape.size() != 3 || pos.shape[0] != 1 || pos.shape[2] != dim)
    throw Error(what + ": tensor 'pos_embed' has shape " + shape_text(pos.shape) + ", expected [1, tokens, " + std::to_string(dim) + "]");
  const int64_t pos_rows = pos.shape[1];
  const int prefix = c.prefix_tokens();
  int img_h = 0, img_w = 0;
  if (pre.contains("input_size") && pre["input_size"].is_array() && pre["input_size"].size() == 3 &&
      pre["input_size"][1].is_number_integer() && pre["input_size"][2].is_number_integer()) {
    img_h = pre["input_size"][1].get<int>();
    img_w = pre["input_size"][2].get<int>();
  } else if (args.contains("img_size") && args["img_size"].is_number_integer()) {
    img_h = img_w = args["img_size"].get<int>();
  } else if (args.contains("img_size") && args["img_size"].is_array() && args["img_size"].size() == 2 &&
             args["img_size"][0].is_number_integer() && args["img_size"][1].is_number_integer()) {
    img_h = args["img_size"][0].get<int>();
    img_w = args["img_size"][1].get<int>();
  }
  if (img_h < 0 || img_w < 0 || img_h > 16384 || img_w > 16384)
    throw Error(what + ": config.json input size " + std::to_string(img_h) + "x" + std::to_string(img_w) + " is not in [1, 16384]");
  if (img_h > 0) {
    if (img_h % patch || img_w % patch)
      throw Error(what + ": config.json input size " + std::to_string(img_h) + "x" + std::to_string(img_w) +
                  " is not a multiple of the patch size " + std::to_string(patch) + " (patch_embed.proj.weight)");
    const int64_t patches = static_cast<int64_t>(img_h / patch) * (img_w / patch);
    if (pos_rows == prefix + patches) c.pos_embed_prefix = true;
    else if (pos_rows == patches) c.pos_embed_prefix = false;
    else
      throw Error(what + ": config.json input size " + std::to_string(img_h) + "x" + std::to_string(img_w) + " gives " +
                  std::to_string(patches) + " patches, but pos_embed has " + std::to_string(pos_rows) + " rows for " +
                  std::to_string(prefix) + " prefix token(s)");
  } else {
    int side = square_side(pos_rows - prefix);
    c.pos_embed_prefix = side > 0;
    if (side == 0) side = square_side(pos_rows);
    if (side == 0 || prefix == 0) c.pos_embed_prefix = true;
    if (side == 0)
      throw Error(what + ": pos_embed has " + std::to_string(pos_rows) + " rows, not a square patch grid plus " +
                  std::to_string(prefix) + " prefix token(s); vitlens cannot infer the image size");
    img_h = img_w = side * patch;
    note("image size " + std::to_string(img_h) + "x" + std::to_string(img_w) + " from pos_embed (" + std::to_string(side) + "x" +
         std::to_string(side) + " patches" + (c.pos_embed_prefix || prefix == 0 ? "" : ", no rows for the prefix tokens") + ")");
  }
  if (args.contains("no_embed_class") && args["no_embed_class"].is_boolean() &&
      args["no_embed_class"].get<bool>() == c.pos_embed_prefix && prefix > 0)
    throw Error(what + ": config.json model_args.no_embed_class is " + args["no_embed_class"].dump() + " but pos_embed has " +
                std::to_string(pos_rows) + " rows");
  c.img_h = img_h;
  c.img_w = img_w;

  if (json_rgb(pre, "mean", c.mean) && json_rgb(pre, "std", c.std)) {
    // from pretrained_cfg
  } else {
    c.mean = {0.5f, 0.5f, 0.5f};
    c.std = {0.5f, 0.5f, 0.5f};
    note("mean/std 0.5 assumed (no pretrained_cfg mean/std in a config.json)");
  }
  if (!have_config) {
    note("no config.json beside the file: every option read from the tensors (patch " + std::to_string(patch) +
         " from patch_embed.proj.weight, width " + std::to_string(dim) + ", depth " + std::to_string(depth) +
         " from the blocks, MLP " + std::to_string(hidden) + ")");
    note("GELU (exact) and LayerNorm eps 1e-6 assumed: timm's defaults");
  }

  // The classifier: timm's head (C, D); DeiT's distillation head and a num_classes check.
  if (t.drop_prefix("head_dist.")) note("head_dist (DeiT's distillation classifier) ignored");
  if (cfg.contains("num_classes") && cfg["num_classes"].is_number_integer()) {
    const int64_t classes = cfg["num_classes"].get<int64_t>();
    const int64_t in_file = t.has("head.weight") ? t.peek("head.weight").shape.at(0) : 0;
    if (classes != in_file)
      throw Error(what + ": config.json num_classes is " + std::to_string(classes) + " but head.weight has " +
                  std::to_string(in_file) + " rows");
  }
  m.tensors = std::move(t.map);
  return m;
}

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

constexpr HfBlockNames kHfVit{"encoder.layer", "layernorm_before", "attention.attention.query", "attention.attention.key",
                              "attention.attention.value", "attention.output.dense", nullptr, "layernorm_after",
                              "intermediate.dense", "output.dense", nullptr};
constexpr HfBlockNames kHfDinov2{"encoder.layer", "norm1", "attention.attention.query", "attention.attention.key",
                                 "attention.attention.value", "attention.output.dense", "layer_scale1.lambda1", "norm2",
                                 "mlp.fc1", "mlp.fc2", "layer_scale2.lambda1"};
constexpr HfBlockNames kHfClip{"encoder.layers", "layer_norm1", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                               "self_attn.out_proj", nullptr, "layer_norm2", "mlp.fc1", "mlp.fc2", nullptr};

Activation hf_activation(const json& cfg, const std::string& what) {
  const std::string act = cfg.contains("hidden_act") && cfg["hidden_act"].is_string() ? cfg["hidden_act"].get<std::string>() : "gelu";
  if (act == "gelu") return Activation::Gelu;
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") return Activation::GeluTanh;
  if (act == "quick_gelu") return Activation::QuickGelu;
  throw Error(what + ": unsupported model: config.json hidden_act '" + act +
              "'; vitlens computes gelu, gelu_new / gelu_pytorch_tanh and quick_gelu");
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

ConvertedModel convert_hf(Tensors t, const std::string& folder, const LoadOptions& options) {
  const std::string& what = t.what;
  const std::string config_path = folder + "/config.json";
  if (!is_file(config_path))
    throw Error(what + ": a Hugging Face checkpoint needs its config.json beside it, and " + config_path + " is missing");
  json cfg = read_json(config_path, what);
  std::string type = cfg.contains("model_type") && cfg["model_type"].is_string() ? cfg["model_type"].get<std::string>() : "";
  const std::string file = "config.json";
  ConvertedModel m;
  VitConfig& c = m.config;
  auto note = [&](const std::string& s) { m.notes.push_back(s); };

  if (type == "clip") {  // a whole CLIPModel: its vision tower
    if (!cfg.contains("vision_config") || !cfg["vision_config"].is_object())
      throw Error(what + ": config.json of a CLIP model has no vision_config");
    cfg = cfg["vision_config"];
    t.drop_prefix("text_model.");
    t.drop_prefix("text_projection.");
    t.drop_prefix("logit_scale");
    note("text tower ignored: the vision tower of a CLIPModel is shown");
    type = "clip_vision_model";
  }
  const HfBlockNames* names = nullptr;
  std::string prefix;
  if (type == "vit") {
    m.format = "hf-vit", names = &kHfVit, prefix = "vit.";
  } else if (type == "dinov2" || type == "dinov2_with_registers") {
    m.format = "hf-dinov2", names = &kHfDinov2, prefix = "dinov2.";
  } else if (type == "clip_vision_model") {
    m.format = "hf-clip", names = &kHfClip, prefix = "vision_model.";
  } else {
    throw Error(what + ": unsupported model: Hugging Face model_type '" + type +
                "'; vitlens maps vit, dinov2, dinov2_with_registers, clip_vision_model and clip (see README, Supported models)");
  }
  t.strip_prefix(prefix);
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
  if (cfg["image_size"].is_array() && cfg["image_size"].size() == 2 && cfg["image_size"][0].is_number_integer() &&
      cfg["image_size"][1].is_number_integer() && cfg["image_size"][0].get<int64_t>() > 0 &&
      cfg["image_size"][0].get<int64_t>() <= 16384 && cfg["image_size"][1].get<int64_t>() > 0 &&
      cfg["image_size"][1].get<int64_t>() <= 16384) {
    c.img_h = cfg["image_size"][0].get<int>();
    c.img_w = cfg["image_size"][1].get<int>();
  } else {
    c.img_h = c.img_w = json_int(cfg, "image_size", what, file);
  }
  c.norm_eps = static_cast<float>(json_number(cfg, "layer_norm_eps", type == "clip_vision_model" ? 1e-5 : 1e-12, what, file));
  c.act = hf_activation(cfg, what);
  c.qkv_bias = type == "clip_vision_model" ? true : json_bool(cfg, "qkv_bias", true, what, file);
  if (type == "dinov2" || type == "dinov2_with_registers") {
    c.mlp_ratio = json_number(cfg, "mlp_ratio", 4.0, what, file);
    c.layer_scale = true;
  } else {
    c.mlp_ratio = mlp_ratio_for(c.embed_dim, json_int(cfg, "intermediate_size", what, file));
  }
  c.name = cfg.contains("_name_or_path") && cfg["_name_or_path"].is_string() && !cfg["_name_or_path"].get<std::string>().empty()
               ? cfg["_name_or_path"].get<std::string>()
               : type;
  c.description = "Hugging Face " + type;
  const std::string why = c.validate();
  if (!why.empty()) throw Error(what + ": config.json: " + why);

  // The patch embedding, checked against the config.
  const char* patch_name = type == "clip_vision_model" ? "embeddings.patch_embedding.weight" : "embeddings.patch_embeddings.projection.weight";
  int dim = 0, patch = 0;
  read_patch_embed(t.peek(patch_name), patch_name, what, dim, patch);
  if (dim != c.embed_dim || patch != c.patch_size)
    throw Error(what + ": config.json says hidden_size " + std::to_string(c.embed_dim) + ", patch_size " + std::to_string(c.patch_size) +
                " but " + patch_name + " has shape " + shape_text(t.peek(patch_name).shape));
  int blocks = 0;
  while (t.has(std::string(names->layers) + "." + std::to_string(blocks) + "." + names->norm1 + ".weight")) ++blocks;
  if (blocks != c.depth)
    throw Error(what + ": config.json says num_hidden_layers " + std::to_string(c.depth) + " but the file has " +
                std::to_string(blocks) + " blocks");

  const int64_t d = c.embed_dim;
  const int64_t patches = static_cast<int64_t>(c.grid_h()) * c.grid_w();
  TensorMap out;
  out["patch_embed.proj.weight"] = t.take(patch_name);
  if (type == "clip_vision_model") {
    c.patch_bias = false;  // CLIP's Conv2d has bias=False
    c.pre_norm = true;     // pre_layrnorm
    c.final_norm = false;  // post_layernorm norms the pooled class token only
    out["cls_token"] = t.take_as("embeddings.class_embedding", {1, 1, d});
    const TensorData& pos = t.peek("embeddings.position_embedding.weight");
    if (pos.shape.size() != 2 || pos.shape[0] != 1 + patches)
      throw Error(what + ": config.json image_size " + std::to_string(c.img_h) + " gives " + std::to_string(patches) +
                  " patches, but embeddings.position_embedding.weight has shape " + shape_text(pos.shape));
    out["pos_embed"] = t.take_as("embeddings.position_embedding.weight", {1, 1 + patches, d});
    out["norm_pre.weight"] = t.take_as("pre_layrnorm.weight", {d});
    out["norm_pre.bias"] = t.take_as("pre_layrnorm.bias", {d});
    if (t.drop_prefix("post_layernorm."))
      note("post_layernorm ignored: it norms the pooled class token only; the tokens are shown as they leave the last block");
    t.drop_prefix("embeddings.position_ids");
    if (t.drop_prefix("visual_projection.")) note("visual_projection ignored (it maps the pooled vector into CLIP's joint space)");
  } else {
    out["patch_embed.proj.bias"] = t.take_as("embeddings.patch_embeddings.projection.bias", {d});
    TensorData cls = t.take_as("embeddings.cls_token", {1, 1, d});
    const TensorData& pos = t.peek("embeddings.position_embeddings");
    if (pos.shape.size() != 3 || pos.shape[1] != 1 + patches)
      throw Error(what + ": config.json image_size " + std::to_string(c.img_h) + " gives " + std::to_string(patches) +
                  " patches, but embeddings.position_embeddings has shape " + shape_text(pos.shape));
    TensorData pos_embed = t.take_as("embeddings.position_embeddings", {1, 1 + patches, d});
    t.drop_prefix("embeddings.mask_token");
    if (type == "dinov2_with_registers") {
      // Dinov2WithRegistersEmbeddings: cat(cls, patches) + pos, then the registers inserted after
      // the class token without a positional row. As timm's _convert_dinov2: cls + pos[0] folded
      // into the class token (the same float sum the forward would make), pos[1:] for the
      // patches only (no_embed_class).
      c.register_tokens = json_int(cfg, "num_register_tokens", what, file);
      if (c.register_tokens > 0) out["reg_token"] = t.take_as("embeddings.register_tokens", {1, c.register_tokens, d});
      for (int64_t k = 0; k < d; ++k) cls.values[static_cast<size_t>(k)] += pos_embed.values[static_cast<size_t>(k)];
      pos_embed.values.erase(pos_embed.values.begin(), pos_embed.values.begin() + d);
      pos_embed.shape = {1, patches, d};
      c.pos_embed_prefix = false;
    }
    out["cls_token"] = std::move(cls);
    out["pos_embed"] = std::move(pos_embed);
    out["norm.weight"] = t.take_as("layernorm.weight", {d});
    out["norm.bias"] = t.take_as("layernorm.bias", {d});
    if (t.drop_prefix("pooler.")) note("pooler ignored (a dense + tanh on the class token, after the tokens shown)");
  }
  hf_blocks(t, *names, c, out);

  // The classifier: ViTForImageClassification's (C, D) becomes timm's head; Dinov2's reads the
  // class token and the patch mean (C, 2D), which vitlens has no use for.
  if (t.has("classifier.weight")) {
    const TensorData& w = t.peek("classifier.weight");
    if (type == "vit" && w.shape.size() == 2 && w.shape[1] == d && t.has("classifier.bias")) {
      out["head.weight"] = t.take("classifier.weight");
      out["head.bias"] = t.take("classifier.bias");
    } else {
      t.drop_prefix("classifier.");
      note("classifier ignored");
    }
  }
  if (!t.map.empty())
    throw Error(what + ": tensor '" + t.map.begin()->first + "' is not part of a Hugging Face " + type +
                " model as vitlens maps it; vitlens would ignore it");

  // mean/std: preprocessor_config.json when it is there, else the family's usual values.
  const std::string pre_path = folder + "/preprocessor_config.json";
  bool have_norm = false;
  if (is_file(pre_path)) {
    const json pre = read_json(pre_path, what);
    have_norm = json_rgb(pre, "image_mean", c.mean) && json_rgb(pre, "image_std", c.std);
  }
  if (!have_norm) {
    if (type == "vit") c.mean = {0.5f, 0.5f, 0.5f}, c.std = {0.5f, 0.5f, 0.5f};
    else if (type == "clip_vision_model") c.mean = kClipMean, c.std = kClipStd;
    else c.mean = kImagenetMean, c.std = kImagenetStd;
    note("mean/std: no preprocessor_config.json, so " + type + "'s usual values are used");
  }
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
  if (any_starts({"embeddings.patch_embeddings.", "vit.embeddings.", "dinov2.embeddings.", "vision_model.embeddings.",
                  "embeddings.patch_embedding."}))
    return convert_hf(std::move(t), folder, options);
  if (any_starts({"visual.", "model.visual."}))
    throw Error(path + ": unsupported model: an OpenAI / open_clip checkpoint (visual.*); timm's vit_*_clip_* or Hugging Face CLIPVisionModel files open");
  const std::string first = t.map.empty() ? std::string("(no tensors)") : t.map.begin()->first;
  throw Error(path + ": no vitlens config in __metadata__ and the tensor names (first: '" + first +
              "') match neither timm's VisionTransformer nor a Hugging Face ViT, Dinov2 or CLIP vision model (see README, Supported models)");
}

}  // namespace vitlens
