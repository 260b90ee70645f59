#pragma once
// The Vision Transformer forward pass, laid out exactly as timm's VisionTransformer
// (timm/models/vision_transformer.py): patch embedding, prefix tokens (class, distillation,
// registers), positional embedding, optional pre-norm, `depth` blocks (pre-norm, or timm's
// residual post-norm) with optional LayerScale, rotary position embeddings on the queries and keys
// and a GELU or SwiGLU MLP, final norm. One block with options covers the families vitlens opens
// (timm ViT, DeiT, DINO, DINOv2 with or without registers, CLIP's vision tower, timm's Eva as
// DINOv3 and EVA-02, Hugging Face ViT / Dinov2 / CLIPVision / DINOv3ViT): models/ maps each file's
// tensor names onto this layout at load time. Weights are read-only views into one blob that the model owns; the file
// formats live in models/.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/model/attention.hpp"
#include "core/base/eigen.hpp"
#include "core/cpu/bf16.hpp"
#include "core/cpu/gemm.hpp"

namespace vitlens {

// The MLP's activation (timm act_layer / Hugging Face hidden_act).
enum class Activation {
  Gelu,       // exact: 0.5 x (1 + erf(x / sqrt 2)), nn.GELU()          timm 'gelu', HF 'gelu'
  GeluTanh,   // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))          timm 'gelu_tanh', HF 'gelu_new'
  QuickGelu,  // x sigmoid(1.702 x), OpenAI CLIP                            timm/HF 'quick_gelu'
};
const char* activation_name(Activation act);  // "gelu", "gelu_tanh", "quick_gelu"

// How the classifier head reads the tokens after the blocks (timm global_pool_nlc; transformers'
// *ForImageClassification read the class token). core/model/classifier.hpp computes the head.
enum class HeadPool {
  Auto,    // the class token when the model has one, else Avg: the trainer's pooling (vitlens files)
  Token,   // x[:, 0]                                  timm 'token', transformers ViT / DeiT
  Avg,     // x[:, prefix:].mean(1)                    timm 'avg'
  Max,     // x[:, prefix:].amax(1)                    timm 'max'
  AvgMax,  // 0.5 * (amax + mean) over x[:, prefix:]   timm 'avgmax'
  Map,     // the attention pool's output (ForwardResult::pooled)  timm 'map' (SigLIP)
};
const char* head_pool_name(HeadPool pool);  // "auto", "token", "avg", "max", "avgmax", "map"
bool parse_head_pool(const std::string& text, HeadPool& pool);
// Rotary position embeddings on the patch tokens' queries and keys (the prefix tokens keep theirs):
// each head's d channels hold d/4 frequencies of the patch row's coordinate and d/4 of its column's,
// each a rotation of a channel pair by the angle coordinate * frequency.
enum class Rope {
  None,
  Dinov3,  // timm RotaryEmbeddingDinoV3 / transformers DINOv3ViTRopePositionEmbedding: patch centres
           // normalised to [-1, 1] by the grid's own size, angle 2 pi c / temperature^(4j/d)
  Eva,     // timm RotaryEmbeddingCat (EVA-02, in_pixels=False): integer patch indices, rescaled to
           // the reference grid when there is one, angle c / temperature^(4j/d)
};
const char* rope_name(Rope rope);  // "none", "dinov3", "eva"

// The longest texts a config holds, in bytes: a name is one line of a caption, a description a
// paragraph. Model readers cut longer texts from a file to these (capped_text, json_file.hpp);
// validate() refuses longer ones given any other way (e.g. `vitlens train --name`).
constexpr size_t kMaxModelNameBytes = 200;
constexpr size_t kMaxModelDescriptionBytes = 2000;
constexpr size_t kMaxHeadDescriptionBytes = 1000;

// hparams, as stored in the safetensors metadata (`__metadata__["config"]`).
// Token order (N): [class token] [distillation token] [register tokens] patches, as timm's
// VisionTransformer / VisionTransformerDistilled concatenate them.
struct VitConfig {
  std::string name = "unnamed";
  std::string description;
  int patch_size = 4;       // P
  int embed_dim = 48;       // D
  int num_heads = 4;        // H
  int depth = 1;            // L
  int img_h = 224, img_w = 224;
  bool class_token = true;
  double mlp_ratio = 4.0;   // double, as Python: int(D * mlp_ratio) must match timm
  float norm_eps = 1e-6f;
  bool qkv_bias = true;
  // Architecture options beyond the original vitlens block; the defaults are that block.
  bool dist_token = false;      // DeiT distilled: a second prefix token after the class token
  int register_tokens = 0;      // R: DINOv2-with-registers / timm reg_tokens, after class/dist
  bool pos_embed_prefix = true; // the positional table has rows for the prefix tokens (timm's
                                // default); false = timm no_embed_class (DeiT III, DINOv2+reg)
  bool patch_bias = true;       // patch_embed.proj.bias (timm: absent when pre_norm, e.g. CLIP)
  bool pre_norm = false;        // LayerNorm before the blocks: timm norm_pre, CLIP pre_layrnorm
  bool layer_scale = false;     // ls1/ls2 gamma (DINOv2 layer_scale1/2.lambda1): x + gamma * branch
  bool post_norm = false;       // residual post-norm (timm ResPostBlock, vit_*_rpn_*): x + norm1(attn(x)),
                                // x + norm2(mlp(x)) instead of x + attn(norm1(x)), x + mlp(norm2(x))
  bool final_norm = true;       // norm over every token after the blocks; false when the model
                                // only norms the pooled vector (timm fc_norm, CLIP post_layernorm)
  bool attention_pool = false;  // an attention-pool head on the output tokens (timm global_pool 'map',
                                // SigLIP's head): a learned latent query over the patch tokens
                                // (attention_pool.hpp); its MLP is mlp_hidden() wide, as the blocks'
  Activation act = Activation::Gelu;
  HeadPool head_pool = HeadPool::Auto;  // what the classifier head reads (when there is one)
  bool pool_include_prefix = false;     // timm pool_include_prefix: Avg/Max over the prefix tokens too
  bool pos_embed = true;        // a learned absolute position table (false: positions are rotary only, DINOv3)
  Rope rope = Rope::None;       // rotary embeddings on the patch tokens' queries and keys
  float rope_temperature = 10000.0f;  // the frequencies' base (timm rope_temperature, HF rope_theta)
  bool rope_rotate_half = false;      // pairs (c, c + d/2) as rotate_half; false: (2j, 2j + 1) interleaved
  float rope_grid_offset = 0.0f;      // added to each patch index before normalising (timm rope_grid_offset)
  int rope_ref_h = 0, rope_ref_w = 0; // Eva: coordinates rescaled to this grid (timm ref_feat_shape); 0 = none
  bool swiglu = false;          // MLP = fc2(silu(gate) * value), fc1 (2 Hm, D) rows [gate | value] (timm
                                // SwiGLU fc1_g / fc1_x, SwiGLUPacked, HF gated MLP); else fc2(act(fc1 x))
  bool mlp_norm = false;        // a LayerNorm over the MLP's hidden Hm before fc2 (timm scale_mlp, EVA-02)
  bool attn_out_norm = false;   // a norm over the heads' concatenated output before proj (timm scale_attn_norm,
                                // Eva scale_attn_inner: EVA-02 CLIP)
  bool rms_norm = false;        // every norm is timm's RmsNorm, x rsqrt(mean(x^2) + eps) weight, without bias
  std::array<float, 3> mean{0.5f, 0.5f, 0.5f};  // per RGB channel, applied to x / 255
  std::array<float, 3> std{0.5f, 0.5f, 0.5f};
  // Optional human descriptions: head_descriptions[layer][head]. Empty when the file has none.
  std::vector<std::vector<std::string>> head_descriptions;

  int head_dim() const { return embed_dim / num_heads; }                   // d
  int mlp_hidden() const { return static_cast<int>(embed_dim * mlp_ratio); }  // Hm (timm: int(), in double)
  int fc1_rows() const { return swiglu ? 2 * mlp_hidden() : mlp_hidden(); }  // fc1's outputs: Hm, or gate and value
  int prefix_tokens() const { return (class_token ? 1 : 0) + (dist_token ? 1 : 0) + register_tokens; }
  int class_index() const { return class_token ? 0 : -1; }  // the class token's row, -1 without
  int dist_index() const { return dist_token ? (class_token ? 1 : 0) : -1; }
  int first_register() const { return (class_token ? 1 : 0) + (dist_token ? 1 : 0); }
  int pos_prefix() const { return pos_embed_prefix ? prefix_tokens() : 0; }  // prefix rows of pos_embed
  int grid_h() const { return img_h / patch_size; }
  int grid_w() const { return img_w / patch_size; }
  int pos_tokens() const { return pos_embed ? pos_prefix() + grid_h() * grid_w() : 0; }  // rows of pos_embed
  int tokens() const { return prefix_tokens() + grid_h() * grid_w(); }   // N at the config's size
  int patch_values() const { return 3 * patch_size * patch_size; }  // 48 for P = 4
  // Empty when consistent, else a one-line reason naming the key (e.g. "embed_dim 50 is not
  // divisible by num_heads 4").
  std::string validate() const;
};

struct BlockWeights {
  // A null bias is a zero bias (qkv_bias false); ls1/ls2 are null without LayerScale.
  const float* norm1_w = nullptr;  // (D)
  const float* norm1_b = nullptr;  // (D)
  const float* qkv_w = nullptr;    // (3D, D): rows [Q heads 0..H-1 | K heads | V heads]
  const float* qkv_b = nullptr;    // (3D) or nullptr when qkv_bias is false
  const float* attn_norm_w = nullptr;  // (D) attn_out_norm only
  const float* attn_norm_b = nullptr;  // (D)
  const float* proj_w = nullptr;   // (D, D)  W^O
  const float* proj_b = nullptr;   // (D)
  const float* ls1 = nullptr;      // (D) LayerScale gamma on the attention branch
  const float* norm2_w = nullptr;  // (D)
  const float* norm2_b = nullptr;  // (D)
  const float* ls2 = nullptr;      // (D) LayerScale gamma on the MLP branch
  const float* fc1_w = nullptr;    // (Hm, D), or (2 Hm, D) rows [gate | value] with swiglu
  const float* fc1_b = nullptr;    // (Hm) or (2 Hm)
  const float* mlp_norm_w = nullptr;  // (Hm) mlp_norm only
  const float* mlp_norm_b = nullptr;  // (Hm)
  const float* fc2_w = nullptr;    // (D, Hm)
  const float* fc2_b = nullptr;    // (D)
};

// The attention-pool head (timm AttentionPoolLatent, transformers
// SiglipMultiheadAttentionPoolingHead): null pointers without one.
struct AttentionPoolWeights {
  const float* latent = nullptr;   // (D) the learned query (timm latent, HF probe)
  const float* q_w = nullptr;      // (D, D)
  const float* q_b = nullptr;      // (D)
  const float* kv_w = nullptr;     // (2D, D): rows [K heads 0..H-1 | V heads]
  const float* kv_b = nullptr;     // (2D)
  const float* proj_w = nullptr;   // (D, D)
  const float* proj_b = nullptr;   // (D)
  const float* norm_w = nullptr;   // (D)
  const float* norm_b = nullptr;   // (D)
  const float* fc1_w = nullptr;    // (Hm, D)
  const float* fc1_b = nullptr;    // (Hm)
  const float* fc2_w = nullptr;    // (D, Hm)
  const float* fc2_b = nullptr;    // (D)
};

struct VitWeights {
  const float* patch_w = nullptr;    // (D, 3, P, P)  Conv2d weight
  const float* patch_b = nullptr;    // (D) or nullptr without patch_bias
  const float* cls_token = nullptr;  // (D) or nullptr without class token
  const float* dist_token = nullptr; // (D) or nullptr without distillation token
  const float* reg_tokens = nullptr; // (R, D) or nullptr without registers
  const float* pos_embed = nullptr;  // (pos_prefix + gh*gw, D) for the config's img_size; null without one
  const float* norm_pre_w = nullptr; // (D) pre_norm only
  const float* norm_pre_b = nullptr; // (D)
  std::vector<BlockWeights> blocks;  // (L)
  const float* norm_w = nullptr;     // (D) final_norm only
  const float* norm_b = nullptr;     // (D)
  const float* fc_norm_w = nullptr;  // (D) timm fc_norm: a LayerNorm on the pooled vector, or nullptr
  const float* fc_norm_b = nullptr;  // (D)
  AttentionPoolWeights pool;         // attention_pool only
  const float* head_w = nullptr;     // (num_classes, D) or nullptr
  const float* head_b = nullptr;     // (num_classes) or nullptr
  const float* head_dist_w = nullptr;  // (num_classes, D) DeiT's distillation head on the
  const float* head_dist_b = nullptr;  // distillation token, or nullptr (classifier.hpp)
  int num_classes = 0;
};

// The arithmetic of the forward's products: the Linear layers (patch embedding, qkv, proj, fc1,
// fc2) and the attention's Q K^T and P V.
//   Fp32: float32 throughout, the PyTorch parity the tests hold (the default).
//   Bf16: their operands rounded to bfloat16, sums in float32 (bf16.hpp; the probabilities rounded
//         for P V as PyTorch's bfloat16 matmul takes them: attention_bf16.hpp); softmax, LayerNorm,
//         GELU, the residual stream and the maps' probabilities stay float32.
//   Auto: Bf16 for models of at least kAutoBf16MinParameters on a CPU with bfloat16 dot products
//         (cpu_has_bf16_dot), else Fp32: below that size a forward is quick either way.
enum class Precision { Fp32, Bf16, Auto };
constexpr int64_t kAutoBf16MinParameters = 20000000;  // ViT-S/16 (22 M) and larger
const char* precision_name(Precision precision);  // "fp32", "bf16", "auto"
// "fp32", "bf16" or "auto" -> the precision; false for anything else.
bool parse_precision(const std::string& text, Precision& precision);
struct VitModel;
// Auto resolved for this model on this CPU; Fp32 and Bf16 as given.
Precision resolve_precision(Precision precision, const VitModel& model);

// Every block's four Linear weights (qkv, proj, fc1, fc2) packed into the SGEMM's panels
// (gemm.hpp pack_linear) for one set of kernels: what forward() reads instead of packing them on
// every call. Immutable once made; forward() holds a shared_ptr to it while it runs.
struct PackedModelWeights {
  const detail::GemmKernels* kernels = nullptr;  // packed for these (kernel_isa() when made)
  std::vector<std::array<PackedLinear, 4>> blocks;  // (L) x {qkv, proj, fc1, fc2}
};

// The same four weights of every block and the patch embedding rounded to bfloat16 and packed
// (bf16.hpp), made once by the first Precision::Bf16 forward: 2 bytes a weight (+170 MiB for
// ViT-B/16), the float32 panels not made at all while only bf16 forwards run.
struct PackedModelWeightsBf16 {
  std::vector<std::array<PackedLinearBf16, 4>> blocks;  // (L) x {qkv, proj, fc1, fc2}
  PackedLinearBf16 patch;                               // (D, 3 P P)
};

// The model's packed weights, made by its first forward() and replaced when kernel_isa() changes
// (set_kernel_isa). The mutex is held while a copy is made, so forwards starting together on
// several threads wait for one copy and share it; a forward keeps its copy alive while it runs.
struct PackedWeightCache {
  std::mutex mutex;
  std::shared_ptr<const PackedModelWeights> packed;
  std::shared_ptr<const PackedModelWeightsBf16> packed_bf16;  // any bfloat16 kernel reads the same panels
};

// How the positional table is resized to a grid other than the trained one, as the model's
// library does it (torch.nn.functional.interpolate, mode "bicubic", align_corners=False, by size).
enum class PositionResize {
  Bicubic,           // antialias=False: vitlens' own models, transformers ViT, CLIP and Dinov2Model
  BicubicAntialias,  // antialias=True: timm's resample_abs_pos_embed, transformers
                     // Dinov2WithRegisters (core/model/interpolate.hpp)
};
const char* position_resize_name(PositionResize r);  // "bicubic", "bicubic-antialias"

// A loaded model: config plus weights viewing `storage`. Move-only, so the views stay valid.
// The weights must not change after loading (nothing does that: training makes a new model):
// forward() keeps them packed in `packed_cache`, found again by their addresses and the kernels.
// That is a second copy of the Linear weights, 12 D^2 floats a block at mlp_ratio 4 (+81 MiB for
// ViT-S/16, +324 MiB for ViT-B/16), for not packing them on every forward (README "Speed").
struct VitModel {
  VitConfig config;
  std::vector<float> storage;
  VitWeights w;
  std::string source;  // the file it came from, for messages
  std::string format = "vitlens";  // the layout it was read from ("vitlens", "timm", "hf-vit", ...)
  std::vector<std::string> notes;  // what the loader inferred or assumed, one line each (vitlens info)
  std::vector<std::string> class_names;  // (num_classes) the classifier's labels, or empty (classifier.hpp)
  std::string class_names_source;        // where they came from ("config.json id2label", ...)
  PositionResize position_resize = PositionResize::Bicubic;  // set by the loader from the layout
  // Empty until the first forward() fills it; null in a moved-from model (forward() then packs
  // for each call).
  std::unique_ptr<PackedWeightCache> packed_cache = std::make_unique<PackedWeightCache>();

  VitModel() = default;
  VitModel(VitModel&&) = default;
  VitModel& operator=(VitModel&&) = default;
  VitModel(const VitModel&) = delete;
  VitModel& operator=(const VitModel&) = delete;

  int64_t parameter_count() const;
};

// Tokens of one prepared image, ready for the blocks.
struct PatchGrid {
  int grid_h = 0, grid_w = 0;              // gh, gw
  MatRM patches;                           // (gh*gw, 3*P*P) normalised pixels, (c, y, x) per row
  std::vector<uint8_t> patch_is_padding;   // (gh*gw) 1 where the patch holds padded pixels
};

struct ForwardOptions {
  bool causal = false;                   // raster-order causal mask
  bool mask_padding = true;              // padded patches are never attended to
  std::vector<uint8_t> forbidden_patches;  // (gh*gw) 1 = never attended (a painted mask); may be empty
  bool keep_probs = false;               // keep every (N, N) weight matrix (raw export only)
  float score_scale = -1.0f;             // < 0: the model's 1/sqrt(d); else this factor instead
  int threads = 0;                       // attention threads; 0 = one per core (same numbers for any count)
  Precision precision = Precision::Fp32;   // the products' arithmetic
  // Progress in [0, 1]; return false to cancel (forward then throws vitlens::Error "cancelled").
  std::function<bool(float)> progress;
};

struct LayerState {
  MatRM qkv;       // (N, 3D) LN1(x) W_qkv^T + b: every head's queries, keys and values, the patch
                   // tokens' queries and keys rotated when the model has rotary embeddings
  MatRM received;  // (H, N) attention received: each column's mean over the non-padding query rows
                   // (a row whose keys are all masked is a zero row and still counts)
  MatRM cls_row;   // (H, N) the class token's attention row; empty without class token
  std::vector<MatRM> probs;  // H x (N, N) when keep_probs, else empty
  MatRM key_panels;  // (H, aligned_keys(N) * d) each head's keys in 16-token panels (fast_attention.hpp),
                     // so attention_row reads 8 or 16 tokens per vector load
};

struct ForwardResult {
  int tokens = 0;   // N
  int prefix = 0;   // prefix tokens before the patches (class, distillation, registers)
  bool has_class_token = false;  // token 0 is the class token
  int grid_h = 0, grid_w = 0;
  std::vector<uint8_t> patch_is_padding;  // (gh*gw) the grid's: 1 = padding, not part of the image
  float score_scale = 0.0f;        // the factor the scores were multiplied by
  Precision precision = Precision::Fp32;  // what the products ran (Auto resolved)
  KeyMask mask;                    // the mask every layer used
  int received_queries = 0;        // how many query rows the received means average over
  std::vector<LayerState> layers;  // (L)
  MatRM output;                    // (N, D) after the final norm (or the last block's tokens
                                   // when the model has no final norm over the tokens)
  // With an attention pool (VitConfig::attention_pool), else empty (attention_pool.hpp):
  MatRM pool_probs;                // (H, N) each head's weights of the pool's latent query over every
                                   // token; 0 on the prefix tokens, which the pool does not read
  MatRM pooled;                    // (1, D) the pool's output: timm forward_head(pre_logits=True),
                                   // HF pooler_output; what a classifier head on the pool reads
};

// The MLP activation on `count` values in place, the same numbers as the blocks' MLP.
void activation_inplace(Activation act, float* x, int64_t count);

// What token `token` is, for the inspector and messages: "class token", "distillation token",
// "register 2", "patch (row 3, col 5)".
std::string token_name(const VitConfig& config, int grid_w, int token);

// The key mask for a grid, from the options (class token always allowed as a key).
KeyMask build_key_mask(const VitConfig& config, const PatchGrid& grid, const ForwardOptions& options);

// Positional table for a gh x gw grid: the model's own when the grid matches, else the patch part
// resized as model.position_resize says: bicubic interpolation (align_corners=False, A = -0.75, as
// torch.nn.functional.interpolate(mode="bicubic")) or its antialiased form (interpolate.hpp);
// prefix rows kept.
MatRM positional_table(const VitModel& model, int grid_h, int grid_w);  // (pos_prefix + gh*gw, D)

// The whole forward pass. Throws vitlens::Error on a grid the model cannot take or on cancel.
ForwardResult forward(const VitModel& model, const PatchGrid& grid, const ForwardOptions& options);

// One query's attention row for one head, from that query's q and all keys: O(N * d).
// out: (N) weights over all tokens (class token first). Same numbers as row `query` of probs.
void attention_row(const VitModel& model, const ForwardResult& result, int layer, int head,
                   int query, float* out);

}  // namespace vitlens
