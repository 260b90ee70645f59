// The ViT forward pass, step by step as timm's VisionTransformer.forward_features computes it.
#include "core/model/vit.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/base/enum_names.hpp"
#include "core/base/error.hpp"
#include "core/cpu/attention_bf16.hpp"
#include "core/cpu/fast_attention.hpp"
#include "core/cpu/gemm.hpp"
#include "core/base/parallel.hpp"
#include "core/model/attention_pool.hpp"
#include "core/model/interpolate.hpp"

namespace vitlens {

std::string VitConfig::validate() const {
  std::ostringstream why;
  if (patch_size < 1 || patch_size > 64) why << "patch_size " << patch_size << " is not in [1, 64]";
  else if (embed_dim < 1 || embed_dim > 8192) why << "embed_dim " << embed_dim << " is not in [1, 8192]";
  else if (num_heads < 1 || num_heads > embed_dim) why << "num_heads " << num_heads << " is not in [1, embed_dim]";
  else if (embed_dim % num_heads != 0)
    why << "embed_dim " << embed_dim << " is not divisible by num_heads " << num_heads;
  else if (depth < 1 || depth > 256) why << "depth " << depth << " is not in [1, 256]";
  else if (img_h < patch_size || img_w < patch_size || img_h > 16384 || img_w > 16384)
    why << "img_size [" << img_h << ", " << img_w << "] is not in [patch_size, 16384]";
  else if (img_h % patch_size != 0 || img_w % patch_size != 0)
    why << "img_size [" << img_h << ", " << img_w << "] is not a multiple of patch_size " << patch_size;
  else if (!(mlp_ratio > 0.0) || mlp_ratio > 64.0)
    why << "mlp_ratio " << mlp_ratio << " is not in (0, 64]";
  else if (mlp_hidden() < 1)
    why << "mlp_ratio " << mlp_ratio << " gives an MLP hidden size of int(" << embed_dim << " * " << mlp_ratio << ") = 0";
  else if (!(norm_eps > 0.0f) || norm_eps > 1.0f) why << "norm_eps " << norm_eps << " is not in (0, 1]";
  else if (register_tokens < 0 || register_tokens > 256) why << "register_tokens " << register_tokens << " is not in [0, 256]";
  else if (attention_pool && (swiglu || mlp_norm || rms_norm))
    why << "attention_pool with " << (swiglu ? "swiglu" : mlp_norm ? "mlp_norm" : "rms_norm")
        << " blocks: the attention pool's MLP and norm are computed as LayerNorm and a plain MLP only";
  else if (rope != Rope::None && head_dim() % 4 != 0)
    why << "rotary embeddings need a head width divisible by 4, and it is " << head_dim();
  else if (rope != Rope::None && (!(rope_temperature > 0.0f) || !std::isfinite(rope_temperature)))
    why << "rope_temperature " << rope_temperature << " is not a positive number";
  else if (rope != Rope::None && (!std::isfinite(rope_grid_offset) || std::abs(rope_grid_offset) > 16384.0f))
    why << "rope_grid_offset " << rope_grid_offset << " is not in [-16384, 16384]";
  else if (rope_ref_h < 0 || rope_ref_w < 0 || rope_ref_h > 16384 || rope_ref_w > 16384 || (rope_ref_h == 0) != (rope_ref_w == 0))
    why << "rope reference grid [" << rope_ref_h << ", " << rope_ref_w << "] is not two sides in [1, 16384] (or none)";
  else {
    for (int c = 0; c < 3; ++c) {
      if (!std::isfinite(mean[c])) { why << "mean[" << c << "] is not finite"; break; }
      if (std::abs(mean[c]) > 1e3f) { why << "mean[" << c << "] " << mean[c] << " is not in [-1000, 1000]"; break; }
      // Pixels are in [0, 1]: a std below 1e-6 would turn them into numbers of 1e6 and more.
      if (!(std[c] >= 1e-6f) || !std::isfinite(std[c]) || std[c] > 1e3f) { why << "std[" << c << "] " << std[c] << " is not in [1e-6, 1000]"; break; }
    }
  }
  if (why.tellp() == 0 && head_pool == HeadPool::Token && !class_token)
    why << "head_pool 'token' needs a class token";
  else if (why.tellp() == 0 && head_pool == HeadPool::Map && !attention_pool)
    why << "global_pool 'map' needs an attention pool (attention_pool)";
  else if (why.tellp() == 0 && attention_pool && pool_include_prefix)
    why << "pool_include_prefix with an attention pool: vitlens' attention pool reads the patch tokens only";
  if (why.tellp() == 0 && name.size() > kMaxModelNameBytes)
    why << "name is " << name.size() << " bytes long, more than " << kMaxModelNameBytes;
  else if (why.tellp() == 0 && description.size() > kMaxModelDescriptionBytes)
    why << "description is " << description.size() << " bytes long, more than " << kMaxModelDescriptionBytes;
  if (why.tellp() == 0)
    for (const auto& layer : head_descriptions)
      for (const std::string& text : layer)
        if (why.tellp() == 0 && text.size() > kMaxHeadDescriptionBytes)
          why << "a head description is " << text.size() << " bytes long, more than " << kMaxHeadDescriptionBytes;
  if (why.tellp() == 0 && !head_descriptions.empty()) {
    if (static_cast<int>(head_descriptions.size()) != depth)
      why << "head_descriptions has " << head_descriptions.size() << " layers, depth is " << depth;
    else
      for (const auto& layer : head_descriptions)
        if (static_cast<int>(layer.size()) != num_heads) {
          why << "head_descriptions has a layer with " << layer.size() << " heads, num_heads is " << num_heads;
          break;
        }
  }
  return why.str();
}

const char* position_resize_name(PositionResize r) {
  return r == PositionResize::BicubicAntialias ? "bicubic-antialias" : "bicubic";
}

const char* rope_name(Rope rope) {
  switch (rope) {
    case Rope::None: return "none";
    case Rope::Dinov3: return "dinov3";
    case Rope::Eva: return "eva";
  }
  return "?";
}

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::Gelu: return "gelu";
    case Activation::GeluTanh: return "gelu_tanh";
    case Activation::QuickGelu: return "quick_gelu";
  }
  return "?";
}

namespace {
constexpr EnumName<HeadPool> kHeadPoolNames[] = {{HeadPool::Auto, "auto"},
                                                 {HeadPool::Token, "token"},
                                                 {HeadPool::Avg, "avg"},
                                                 {HeadPool::Max, "max"},
                                                 {HeadPool::AvgMax, "avgmax"},
                                                 {HeadPool::Map, "map"}};
}  // namespace

const char* head_pool_name(HeadPool pool) { return enum_name(kHeadPoolNames, pool); }
bool parse_head_pool(const std::string& text, HeadPool& pool) { return parse_enum(kHeadPoolNames, text, pool); }

std::string token_name(const VitConfig& config, int grid_w, int token) {
  if (token == config.class_index()) return "class token";
  if (token == config.dist_index()) return "distillation token";
  const int prefix = config.prefix_tokens();
  if (token >= config.first_register() && token < prefix)
    return "register " + std::to_string(token - config.first_register());
  if (token < prefix || grid_w < 1) return "token " + std::to_string(token);
  const int patch = token - prefix;
  return "patch (row " + std::to_string(patch / grid_w) + ", col " + std::to_string(patch % grid_w) + ")";
}

int64_t VitModel::parameter_count() const { return static_cast<int64_t>(storage.size()); }

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::Fp32: return "fp32";
    case Precision::Bf16: return "bf16";
    case Precision::Auto: return "auto";
  }
  return "?";
}

bool parse_precision(const std::string& text, Precision& precision) {
  for (Precision p : {Precision::Fp32, Precision::Bf16, Precision::Auto})
    if (text == precision_name(p)) {
      precision = p;
      return true;
    }
  return false;
}

Precision resolve_precision(Precision precision, const VitModel& model) {
  if (precision != Precision::Auto) return precision;
  return model.parameter_count() >= kAutoBf16MinParameters && cpu_has_bf16_dot() ? Precision::Bf16
                                                                                  : Precision::Fp32;
}

KeyMask build_key_mask(const VitConfig& config, const PatchGrid& grid, const ForwardOptions& options) {
  KeyMask mask;
  mask.causal = options.causal;
  const int prefix = config.prefix_tokens();
  const int patches = grid.grid_h * grid.grid_w;
  bool any_forbidden = false;
  std::vector<uint8_t> allowed(static_cast<size_t>(prefix + patches), 1);
  for (int p = 0; p < patches; ++p) {
    bool forbid = false;
    if (options.mask_padding && !grid.patch_is_padding.empty() && grid.patch_is_padding[p]) forbid = true;
    if (!options.forbidden_patches.empty()) {
      if (static_cast<int>(options.forbidden_patches.size()) != patches)
        throw Error("painted mask has " + std::to_string(options.forbidden_patches.size()) +
                    " patches, the image has " + std::to_string(patches));
      if (options.forbidden_patches[p]) forbid = true;
    }
    if (forbid) {
      allowed[static_cast<size_t>(prefix + p)] = 0;
      any_forbidden = true;
    }
  }
  if (any_forbidden) mask.key_allowed = std::move(allowed);
  return mask;
}

namespace {

// torch's upsample_bicubic2d kernel (A = -0.75), aten/src/ATen/native/UpSample.h.
float cubic_near(float x, float a) { return ((a + 2.0f) * x - (a + 3.0f)) * x * x + 1.0f; }
float cubic_far(float x, float a) { return ((a * x - 5.0f * a) * x + 8.0f * a) * x - 4.0f * a; }

void cubic_coefficients(float t, float coeffs[4]) {
  constexpr float kA = -0.75f;
  coeffs[0] = cubic_far(t + 1.0f, kA);
  coeffs[1] = cubic_near(t, kA);
  coeffs[2] = cubic_near(1.0f - t, kA);
  coeffs[3] = cubic_far(2.0f - t, kA);
}

// Source taps for output index `out` of an in -> out resize, align_corners=False; for cubic the
// source coordinate is not clamped at 0, the taps are clamped to the border instead.
void cubic_taps(int out, int in_size, int out_size, int taps[4], float coeffs[4]) {
  const float scale = static_cast<float>(in_size) / static_cast<float>(out_size);
  const float src = (static_cast<float>(out) + 0.5f) * scale - 0.5f;
  const float base = std::floor(src);
  cubic_coefficients(src - base, coeffs);
  for (int k = 0; k < 4; ++k)
    taps[k] = std::clamp(static_cast<int>(base) - 1 + k, 0, in_size - 1);
}

// Runs fn(r0, r1) over the rows [0, n) in fixed chunks of 256 rows, spread over `threads` threads.
// The rest of the block (LayerNorm, Linear, GELU) works row by row, so each chunk is independent;
// the chunking does not depend on the thread count, so neither do the numbers.
constexpr int kChunk = 256;

// The thread count for a product inside for_row_chunks: all of them when there is only one chunk.
int threads_within_chunk(int n, int threads) { return n <= kChunk ? threads : 1; }

template <class Fn>
void for_row_chunks(int n, int threads, Fn&& fn) {
  const int chunks = (n + kChunk - 1) / kChunk;
  run_tasks(chunks, threads, [&](int c) { fn(c * kChunk, std::min(n, (c + 1) * kChunk)); });
}

// out[r0:r1] = the model's norm of x[r0:r1] row by row over x's columns, statistics in double: a
// LayerNorm, or with rms_norm timm's RmsNorm, x rsqrt(mean(x^2) + eps) weight (no mean, no bias).
// out is sized already; out may be x (each value is read before it is overwritten).
void token_norm(const VitConfig& cfg, const MatRM& x, const float* weight, const float* bias, MatRM& out, int r0, int r1) {
  const int dim = static_cast<int>(x.cols());
  if (r1 <= r0) return;
  if (!cfg.rms_norm) {
    layer_norm_rows(x.row(r0).data(), dim, r1 - r0, dim, weight, bias, cfg.norm_eps, out.row(r0).data(), dim);
    return;
  }
  for (int r = r0; r < r1; ++r) {
    const float* in = x.row(r).data();
    double squares = 0.0;
    for (int c = 0; c < dim; ++c) squares += static_cast<double>(in[c]) * in[c];
    const double inv = 1.0 / std::sqrt(squares / dim + static_cast<double>(cfg.norm_eps));
    float* o = out.row(r).data();
    for (int c = 0; c < dim; ++c) o[c] = static_cast<float>(in[c] * inv) * weight[c];
  }
}

// y[r0:r1] = x[r0:r1] W^T + b  (nn.Linear), W (out, in) row-major packed by pack_linear; b may be
// null; y is sized. `threads` for the SGEMM itself: 1 when the callers already spread row chunks
// over the cores, all of them when there is a single chunk (a 197-token ViT-S/16 would otherwise
// run on one core). The SGEMM's numbers do not depend on its thread count (gemm.hpp), and the
// packed product gives linear_forward's bits.
void linear(const MatRM& x, const PackedLinear& w, const float* b, MatRM& y, int r0, int r1, int threads = 1,
            LinearEpilogue epilogue = LinearEpilogue::Store) {
  if (r1 <= r0) return;
  linear_forward_packed(x.row(r0).data(), x.cols(), r1 - r0, w, b, y.row(r0).data(), y.cols(), epilogue, threads);
}

// y = x W^T + b over all rows in one product (which packs W once itself), on `threads`.
void linear(const MatRM& x, const float* w, const float* b, int out_features, MatRM& y, int threads) {
  y.resize(x.rows(), out_features);
  linear_forward(x.data(), x.cols(), static_cast<int>(x.rows()), static_cast<int>(x.cols()), w, out_features, b,
                 y.data(), y.cols(), LinearEpilogue::Store, threads);
}

// Whether `packed` holds this model's weights for these kernels (the same source pointers).
bool packed_for(const PackedModelWeights& packed, const VitModel& model, const detail::GemmKernels* kernels) {
  if (packed.kernels != kernels || packed.blocks.size() != model.w.blocks.size()) return false;
  for (size_t l = 0; l < packed.blocks.size(); ++l) {
    const BlockWeights& b = model.w.blocks[l];
    const std::array<PackedLinear, 4>& p = packed.blocks[l];
    if (p[0].w != b.qkv_w || p[1].w != b.proj_w || p[2].w != b.fc1_w || p[3].w != b.fc2_w) return false;
  }
  return true;
}

// Every block's four Linear weights packed for `kernels`.
std::shared_ptr<const PackedModelWeights> pack_model(const VitModel& model, const detail::GemmKernels* kernels,
                                                     int threads) {
  const VitConfig& cfg = model.config;
  const int dim = cfg.embed_dim, hidden = cfg.mlp_hidden();
  auto packed = std::make_shared<PackedModelWeights>();
  packed->kernels = kernels;
  packed->blocks.resize(static_cast<size_t>(cfg.depth));
  for (int l = 0; l < cfg.depth; ++l) {
    const BlockWeights& b = model.w.blocks[static_cast<size_t>(l)];
    std::array<PackedLinear, 4>& p = packed->blocks[static_cast<size_t>(l)];
    pack_linear(b.qkv_w, 3 * dim, dim, p[0], threads);
    pack_linear(b.proj_w, dim, dim, p[1], threads);
    pack_linear(b.fc1_w, cfg.fc1_rows(), dim, p[2], threads);
    pack_linear(b.fc2_w, dim, hidden, p[3], threads);
  }
  return packed;
}

// The model's Linear weights packed for the active kernels: the cached copy when it was packed
// for them, else packed now and kept (under the lock, so that forwards starting together make one
// copy, not one each), or packed for this call alone when the model has no cache (moved from).
std::shared_ptr<const PackedModelWeights> packed_weights(const VitModel& model, int threads) {
  const detail::GemmKernels* kernels = &detail::active_gemm_kernels();
  if (!model.packed_cache) return pack_model(model, kernels, threads);
  std::lock_guard<std::mutex> lock(model.packed_cache->mutex);
  std::shared_ptr<const PackedModelWeights>& cached = model.packed_cache->packed;
  if (!cached || !packed_for(*cached, model, kernels)) {
    cached.reset();  // the old copy goes now (or when the last forward using it ends), not after the new one is made
    cached = pack_model(model, kernels, threads);
  }
  return cached;
}

// The model's Linear weights in bfloat16 panels: made by the first bfloat16 forward and kept
// (under the lock, as packed_weights), or made for this call alone when the model has no cache.
std::shared_ptr<const PackedModelWeightsBf16> packed_weights_bf16(const VitModel& model) {
  auto pack = [&model] {
    const VitConfig& cfg = model.config;
    const int dim = cfg.embed_dim, hidden = cfg.mlp_hidden();
    auto packed = std::make_shared<PackedModelWeightsBf16>();
    packed->blocks.resize(static_cast<size_t>(cfg.depth));
    for (int l = 0; l < cfg.depth; ++l) {
      const BlockWeights& b = model.w.blocks[static_cast<size_t>(l)];
      std::array<PackedLinearBf16, 4>& p = packed->blocks[static_cast<size_t>(l)];
      pack_linear_bf16(b.qkv_w, 3 * dim, dim, p[0]);
      pack_linear_bf16(b.proj_w, dim, dim, p[1]);
      pack_linear_bf16(b.fc1_w, cfg.fc1_rows(), dim, p[2]);
      pack_linear_bf16(b.fc2_w, dim, hidden, p[3]);
    }
    pack_linear_bf16(model.w.patch_w, dim, cfg.patch_values(), packed->patch);
    return std::shared_ptr<const PackedModelWeightsBf16>(std::move(packed));
  };
  if (!model.packed_cache) return pack();
  std::lock_guard<std::mutex> lock(model.packed_cache->mutex);
  if (!model.packed_cache->packed_bf16) model.packed_cache->packed_bf16 = pack();
  return model.packed_cache->packed_bf16;
}

// The Linear weights one forward reads: float32 panels, or bfloat16 ones (the other is null).
struct ForwardLinears {
  std::shared_ptr<const PackedModelWeights> fp32;
  std::shared_ptr<const PackedModelWeightsBf16> bf16;
};
ForwardLinears forward_linears(const VitModel& model, Precision precision, int threads) {
  if (precision == Precision::Bf16) return {nullptr, packed_weights_bf16(model)};
  return {packed_weights(model, threads), nullptr};
}
enum BlockLinear { kQkv = 0, kProj = 1, kFc1 = 2, kFc2 = 3 };

// linear() above with block l's Linear `which`, in the precision of `linears`.
void block_linear(const ForwardLinears& linears, int l, BlockLinear which, const MatRM& x, const float* b, MatRM& y,
                  int r0, int r1, int threads, LinearEpilogue epilogue = LinearEpilogue::Store) {
  if (r1 <= r0) return;
  if (linears.fp32) {
    linear(x, linears.fp32->blocks[static_cast<size_t>(l)][which], b, y, r0, r1, threads, epilogue);
    return;
  }
  linear_forward_bf16(x.row(r0).data(), x.cols(), r1 - r0, linears.bf16->blocks[static_cast<size_t>(l)][which], b,
                      y.row(r0).data(), y.cols(), epilogue, threads);
}

// The patch embedding, x (Np, 3PP) W (D, 3PP)^T + b, in the precision of `linears`.
void patch_embedding(const ForwardLinears& linears, const VitModel& model, const MatRM& patches, MatRM& tokens,
                     int threads) {
  const int dim = model.config.embed_dim;
  if (linears.fp32) {
    linear(patches, model.w.patch_w, model.w.patch_b, dim, tokens, threads);
    return;
  }
  tokens.resize(patches.rows(), dim);
  linear_forward_bf16(patches.data(), patches.cols(), static_cast<int>(patches.rows()), linears.bf16->patch,
                      model.w.patch_b, tokens.data(), tokens.cols(), LinearEpilogue::Store, threads);
}

// fc1's epilogue for the MLP activation: the exact GELU runs inside the product (gemm.hpp: the
// same gelu kernel on the same sums, so the same bits as gelu_inplace after it), on its threads.
LinearEpilogue fc1_epilogue(Activation act) {
  return act == Activation::Gelu ? LinearEpilogue::Gelu : LinearEpilogue::Store;
}

// The MLP activation on rows [r0, r1), in place, after fc1_epilogue(act)'s product.
void activation_rows(Activation act, MatRM& h, int r0, int r1) {
  auto rows = h.middleRows(r0, r1 - r0);
  switch (act) {
    case Activation::Gelu:  // nn.GELU(): done in fc1's epilogue
      break;
    case Activation::GeluTanh:  // nn.GELU(approximate='tanh'), HF gelu_new / gelu_pytorch_tanh
      rows = rows.unaryExpr([](float t) {
        return 0.5f * t * (1.0f + std::tanh(0.79788456080286536f * (t + 0.044715f * t * t * t)));
      });
      break;
    case Activation::QuickGelu:  // OpenAI CLIP: x * sigmoid(1.702 x)
      rows = rows.unaryExpr([](float t) { return t / (1.0f + std::exp(-1.702f * t)); });
      break;
  }
}

}  // namespace

void activation_inplace(Activation act, float* x, int64_t count) {
  if (act == Activation::Gelu) {
    gelu_inplace(x, count);  // the kernel fc1's Gelu epilogue runs (gemm.hpp)
    return;
  }
  MatRM values = ConstMapRM(x, 1, count);
  activation_rows(act, values, 0, 1);
  std::copy(values.data(), values.data() + count, x);
}

namespace {

// gated[r0:r1] = silu(gate) * value, gate and value the two halves of fc1's output (N, 2 Hm):
// nn.SiLU is x * sigmoid(x).
void swiglu_rows(const MatRM& fc1_out, MatRM& gated, int r0, int r1) {
  const Eigen::Index hm = gated.cols();
  for (int r = r0; r < r1; ++r) {
    const float* gate = fc1_out.row(r).data();
    const float* value = gate + hm;
    float* out = gated.row(r).data();
    for (Eigen::Index c = 0; c < hm; ++c) out[c] = gate[c] / (1.0f + std::exp(-gate[c])) * value[c];
  }
}

// Whether every value of m is finite. x - x is 0 for a finite x and NaN for an infinity or a NaN,
// summed in eight independent lanes, which the compiler turns into vector instructions; Eigen's
// allFinite() compared one float at a time (3 % of a ViT-S/16 forward at 224 px).
bool all_finite(const MatRM& m) {
  const float* x = m.data();
  const int64_t count = static_cast<int64_t>(m.size());
  float lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= count; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += x[i + l] - x[i + l];
  for (; i < count; ++i) lanes[0] += x[i] - x[i];
  float all = 0.0f;
  for (float lane : lanes) all += lane;
  return all == 0.0f;
}

// x[r0:r1] += branch[r0:r1], times the LayerScale gamma (D) per column when there is one.
void add_branch(MatRM& x, const MatRM& branch, const float* gamma, int r0, int r1) {
  if (gamma)
    x.middleRows(r0, r1 - r0).array() +=
        branch.middleRows(r0, r1 - r0).array().rowwise() * ConstMapVec(gamma, x.cols()).transpose().array();
  else
    x.middleRows(r0, r1 - r0) += branch.middleRows(r0, r1 - r0);
}

}  // namespace

MatRM positional_table(const VitModel& model, int grid_h, int grid_w) {
  const VitConfig& cfg = model.config;
  const int dim = cfg.embed_dim, prefix = cfg.pos_prefix();
  const int gh0 = cfg.grid_h(), gw0 = cfg.grid_w();
  ConstMapRM pos(model.w.pos_embed, cfg.pos_tokens(), dim);
  if (grid_h == gh0 && grid_w == gw0) return pos;

  MatRM table(prefix + grid_h * grid_w, dim);
  if (prefix) table.topRows(prefix) = pos.topRows(prefix);
  if (model.position_resize == PositionResize::BicubicAntialias) {
    // torch's separable antialias kernel: along columns first, a pass skipped when its size is
    // unchanged; each output a float sum over its window, first tap first.
    MatRM grid = pos.bottomRows(gh0 * gw0);  // (gh0 * gw0, D)
    if (grid_w != gw0) {
      const InterpolationTaps tw = antialias_bicubic_taps(gw0, grid_w);
      MatRM along_w(gh0 * grid_w, dim);
      for (int r = 0; r < gh0; ++r)
        for (int c = 0; c < grid_w; ++c) {
          const float* w = &tw.weights[static_cast<size_t>(c) * static_cast<size_t>(tw.taps)];
          auto dst = along_w.row(r * grid_w + c);
          dst = w[0] * grid.row(r * gw0 + tw.first[static_cast<size_t>(c)]);
          for (int k = 1; k < tw.count[static_cast<size_t>(c)]; ++k)
            dst += w[k] * grid.row(r * gw0 + tw.first[static_cast<size_t>(c)] + k);
        }
      grid = std::move(along_w);
    }
    if (grid_h != gh0) {
      const InterpolationTaps th = antialias_bicubic_taps(gh0, grid_h);
      MatRM along_h(grid_h * grid_w, dim);
      for (int r = 0; r < grid_h; ++r) {
        const float* w = &th.weights[static_cast<size_t>(r) * static_cast<size_t>(th.taps)];
        const int first = th.first[static_cast<size_t>(r)];
        for (int c = 0; c < grid_w; ++c) {
          auto dst = along_h.row(r * grid_w + c);
          dst = w[0] * grid.row(first * grid_w + c);
          for (int k = 1; k < th.count[static_cast<size_t>(r)]; ++k) dst += w[k] * grid.row((first + k) * grid_w + c);
        }
      }
      grid = std::move(along_h);
    }
    table.bottomRows(grid_h * grid_w) = grid;
    return table;
  }
  // Separable bicubic: first along columns (gw0 -> grid_w) for every source row, then rows.
  MatRM along_w(gh0 * grid_w, dim);
  for (int c = 0; c < grid_w; ++c) {
    int taps[4];
    float coeffs[4];
    cubic_taps(c, gw0, grid_w, taps, coeffs);
    for (int r = 0; r < gh0; ++r) {
      auto dst = along_w.row(r * grid_w + c);
      dst.setZero();
      for (int k = 0; k < 4; ++k) dst += coeffs[k] * pos.row(prefix + r * gw0 + taps[k]);
    }
  }
  for (int r = 0; r < grid_h; ++r) {
    int taps[4];
    float coeffs[4];
    cubic_taps(r, gh0, grid_h, taps, coeffs);
    for (int c = 0; c < grid_w; ++c) {
      auto dst = table.row(prefix + r * grid_w + c);
      dst.setZero();
      for (int k = 0; k < 4; ++k) dst += coeffs[k] * along_w.row(taps[k] * grid_w + c);
    }
  }
  return table;
}

namespace {

// [SECTION] Rotary position embeddings

// cos and sin of every patch's rotary angles for a gh x gw grid, as the model's library computes
// them for that grid (the coordinates follow the grid at hand, not the trained one): (gh*gw, d/2)
// each; pair j < d/4 turns with the patch's row coordinate at frequency j, pair d/4 + j with its
// column's (the [y bands | x bands] order of timm's flatten and transformers' angles.flatten(1, 2)).
// Coordinates and frequencies in float32 as the libraries build them, the angle and its sine in double.
struct RopeTable {
  MatRM cos, sin;  // (gh*gw, d/2)
};

RopeTable rope_table(const VitConfig& cfg, int grid_h, int grid_w) {
  const int quarter = cfg.head_dim() / 4, patches = grid_h * grid_w;
  // Frequencies: DINOv3 divides by periods temperature^(2j / (d/2)) (timm _compute_periods;
  // transformers multiplies by 1 / base^(4j/d), the same number); Eva multiplies by the bands
  // 1 / temperature^(j / (d/4)) (timm freq_bands, step 1).
  std::vector<double> freq(static_cast<size_t>(quarter));
  for (int j = 0; j < quarter; ++j) {
    if (cfg.rope == Rope::Dinov3) {
      const float exponent = 2.0f * static_cast<float>(j) / static_cast<float>(cfg.head_dim() / 2);
      freq[static_cast<size_t>(j)] = 2.0 * 3.14159265358979323846 / static_cast<double>(std::pow(cfg.rope_temperature, exponent));
    } else {
      const float exponent = static_cast<float>(j) / static_cast<float>(quarter);
      freq[static_cast<size_t>(j)] = static_cast<double>(1.0f / std::pow(cfg.rope_temperature, exponent));
    }
  }
  // One axis' coordinates: DINOv3 2 (i + 0.5 + offset) / s - 1 (timm _build_grid 'centered',
  // normalize 'separate'; transformers get_patches_center_coordinates), Eva i + offset, times
  // ref / s when there is a reference grid (timm's eva scheme, x / f * r).
  auto coords = [&](int size, int ref) {
    std::vector<double> c(static_cast<size_t>(size));
    for (int i = 0; i < size; ++i) {
      float t;
      if (cfg.rope == Rope::Dinov3) {
        t = (static_cast<float>(i) + 0.5f + cfg.rope_grid_offset) / static_cast<float>(size);
        t = 2.0f * t - 1.0f;
      } else {
        t = static_cast<float>(i) + cfg.rope_grid_offset;
        if (ref > 0) t = t / static_cast<float>(size) * static_cast<float>(ref);
      }
      c[static_cast<size_t>(i)] = static_cast<double>(t);
    }
    return c;
  };
  const std::vector<double> ys = coords(grid_h, cfg.rope_ref_h), xs = coords(grid_w, cfg.rope_ref_w);
  RopeTable table;
  table.cos.resize(patches, 2 * quarter);
  table.sin.resize(patches, 2 * quarter);
  for (int r = 0; r < grid_h; ++r)
    for (int c = 0; c < grid_w; ++c)
      for (int j = 0; j < 2 * quarter; ++j) {
        const double coord = j < quarter ? ys[static_cast<size_t>(r)] : xs[static_cast<size_t>(c)];
        const double angle = coord * freq[static_cast<size_t>(j % quarter)];
        table.cos(r * grid_w + c, j) = static_cast<float>(std::cos(angle));
        table.sin(r * grid_w + c, j) = static_cast<float>(std::sin(angle));
      }
  return table;
}

// Rotates the queries and keys of token rows [r0, r1) of qkv (N, 3D) in place, patch p = row -
// prefix, as timm's apply_rot_embed / transformers' apply_rotary_pos_emb:
//   rotate_half: out[c] = x[c] cos - x[c + d/2] sin, out[c + d/2] = x[c + d/2] cos + x[c] sin
//   interleaved: out[2j] = x[2j] cos - x[2j + 1] sin, out[2j + 1] = x[2j + 1] cos + x[2j] sin
// Prefix rows are left as they are (the libraries skip the class and register tokens).
void apply_rope(const VitConfig& cfg, const RopeTable& table, int prefix, MatRM& qkv, int r0, int r1) {
  const int dim = cfg.embed_dim, hd = cfg.head_dim(), pairs = hd / 2;
  for (int row = std::max(r0, prefix); row < r1; ++row) {
    const float* cs = table.cos.row(row - prefix).data();
    const float* sn = table.sin.row(row - prefix).data();
    for (int part = 0; part < 2; ++part)  // queries, then keys
      for (int h = 0; h < cfg.num_heads; ++h) {
        float* x = qkv.row(row).data() + part * dim + h * hd;
        for (int j = 0; j < pairs; ++j) {
          const int a = cfg.rope_rotate_half ? j : 2 * j, b = cfg.rope_rotate_half ? j + pairs : 2 * j + 1;
          const float xa = x[a], xb = x[b];
          x[a] = xa * cs[j] - xb * sn[j];
          x[b] = xb * cs[j] + xa * sn[j];
        }
      }
  }
}

// [SECTION] The forward

// A forward result's description of its input, before any layer: token counts, grid, padding,
// the score scale and the key mask.
ForwardResult result_header(const VitConfig& cfg, const PatchGrid& grid, const ForwardOptions& options) {
  ForwardResult result;
  result.tokens = cfg.prefix_tokens() + grid.grid_h * grid.grid_w;
  result.prefix = cfg.prefix_tokens();
  result.has_class_token = cfg.class_token;
  result.grid_h = grid.grid_h;
  result.grid_w = grid.grid_w;
  result.patch_is_padding = grid.patch_is_padding;
  result.score_scale = options.score_scale >= 0.0f ? options.score_scale
                                                   : 1.0f / std::sqrt(static_cast<float>(cfg.head_dim()));
  result.mask = build_key_mask(cfg, grid, options);
  return result;
}

// The tokens before the first block: patch embedding, the prefix tokens, the positions, and
// norm_pre when the model has one. (n, D), n = prefix tokens + patches.
MatRM embed_tokens(const VitModel& model, const ForwardLinears& linears, const PatchGrid& grid, int threads) {
  const VitConfig& cfg = model.config;
  const int dim = cfg.embed_dim;
  const int patches = grid.grid_h * grid.grid_w;
  const int n = cfg.prefix_tokens() + patches;
  // x = patch_embed(img): Conv2d(3, D, P, stride=P) == patches (Np, 3PP) @ W (D, 3PP)^T + b
  MatRM x(n, dim);
  {
    MatRM tokens;
    patch_embedding(linears, model, grid.patches, tokens, threads);
    x.bottomRows(patches) = tokens;
    // timm _pos_embed: x = cat(cls_token, [dist_token], reg_token, x), then x + pos_embed over all
    // tokens, or with no_embed_class the pos_embed added to the patches only (before the cat).
    if (cfg.class_token) x.row(cfg.class_index()) = ConstMapVec(model.w.cls_token, dim).transpose();
    if (cfg.dist_token) x.row(cfg.dist_index()) = ConstMapVec(model.w.dist_token, dim).transpose();
    if (cfg.register_tokens)
      x.middleRows(cfg.first_register(), cfg.register_tokens) = ConstMapRM(model.w.reg_tokens, cfg.register_tokens, dim);
    if (cfg.pos_embed) {
      const MatRM pos = positional_table(model, grid.grid_h, grid.grid_w);
      x.bottomRows(pos.rows()) += pos;
    }
  }
  // x = self.norm_pre(x): CLIP's ln_pre / pre_layrnorm, before the first block.
  if (cfg.pre_norm)
    for_row_chunks(n, threads, [&](int r0, int r1) {
      token_norm(cfg, x, model.w.norm_pre_w, model.w.norm_pre_b, x, r0, r1);
    });
  return x;
}

// Layer l's attention, every head at once: attn_out (N, D) and state.received (H, N), the mean
// over the counted query rows (attention received), plus the class token's rows and every P when
// asked. Reports progress and throws vitlens::Error("cancelled") when it is cancelled.
void attend_all_heads(const VitConfig& cfg, const ForwardResult& result, const std::vector<uint8_t>& counts_as_query,
                      int l, const ForwardOptions& options, LayerState& state, MatRM& attn_out) {
  const int n = result.tokens, dim = cfg.embed_dim, heads = cfg.num_heads, hd = cfg.head_dim();
  std::vector<float*> probs;
  if (options.keep_probs) {
    state.probs.assign(static_cast<size_t>(heads), MatRM(n, n));
    for (MatRM& p : state.probs) probs.push_back(p.data());
  }

  // Every head at once (fast_attention.hpp; no (N, N) matrix unless keep_probs), as timm's
  //   attn = (q * scale) @ k.transpose(-2, -1); attn = attn.softmax(dim=-1); x = attn @ v
  // (the scale applied after the dot product, as the reference does), each head's output in its
  // columns of (N, D) (the transpose(1, 2).reshape), plus the column sums of attn over the
  // counted query rows (attention received) and attn's first row (the class token's).
  AttentionInputs in;
  in.tokens = n, in.heads = heads, in.head_dim = hd;
  in.queries = state.qkv.data(), in.keys = state.qkv.data() + dim, in.values = state.qkv.data() + 2 * dim;
  in.query_stride = in.key_stride = in.value_stride = 3 * dim;
  in.scale = result.score_scale;
  in.mask = &result.mask;
  in.counts_as_query = counts_as_query.data();
  AttentionOutputs out;
  out.context = attn_out.data(), out.context_stride = dim;
  out.column_sums = state.received.data();
  out.first_rows = cfg.class_token ? state.cls_row.data() : nullptr;
  out.probs = options.keep_probs ? probs.data() : nullptr;
  std::function<bool(float)> layer_progress;
  if (options.progress)
    layer_progress = [&](float f) { return options.progress((static_cast<float>(l) + f) / cfg.depth); };
  // Precision::Bf16: Q K^T and P V with bfloat16 operands, float32 sums (attention_bf16.hpp).
  const bool finished = result.precision == Precision::Bf16
                            ? multi_head_attention_bf16(in, out, options.threads, layer_progress)
                            : multi_head_attention(in, out, options.threads, layer_progress);
  if (!finished) throw Error("cancelled");
  // Scores can still overflow (finite q and k, a huge score scale): an error, not NaN maps.
  if (!all_finite(attn_out) || !all_finite(state.received))
    throw Error("attention scores overflow in layer " + std::to_string(l) +
                " (NaN or infinity): the score scale or the model's weights are too large");
  if (result.received_queries > 0) state.received /= static_cast<float>(result.received_queries);
  else state.received.setZero();
  if (options.progress && !options.progress(static_cast<float>(l + 1) / static_cast<float>(cfg.depth)))
    throw Error("cancelled");
}

}  // namespace

ForwardResult forward(const VitModel& model, const PatchGrid& grid, const ForwardOptions& options) {
  const VitConfig& cfg = model.config;
  const int dim = cfg.embed_dim, heads = cfg.num_heads, hd = cfg.head_dim();
  const int prefix = cfg.prefix_tokens();
  const int patches = grid.grid_h * grid.grid_w;
  const int n = prefix + patches;
  if (patches < 1) throw Error("the image has no whole patch");
  if (grid.patches.rows() != patches || grid.patches.cols() != cfg.patch_values())
    throw Error("patch grid does not match the model's patch size");

  ForwardResult result = result_header(cfg, grid, options);
  // Which query rows the attention-received mean averages over: every token except padding.
  std::vector<uint8_t> counts_as_query(static_cast<size_t>(n), 1);
  if (options.mask_padding && !grid.patch_is_padding.empty())
    for (int p = 0; p < patches; ++p)
      if (grid.patch_is_padding[p]) counts_as_query[static_cast<size_t>(prefix + p)] = 0;
  result.received_queries = static_cast<int>(std::count(counts_as_query.begin(), counts_as_query.end(), 1));

  result.precision = resolve_precision(options.precision, model);
  // Every Linear weight in the product's panels (float32 or bfloat16), packed by the model's first
  // forward in that precision and kept with it (vit.hpp VitModel::packed_cache), not packed again
  // by every product of every row chunk (13 times per layer at 3137 tokens).
  const ForwardLinears linears = forward_linears(model, result.precision, options.threads);
  MatRM x = embed_tokens(model, linears, grid, options.threads);

  MatRM normed, attn_out(n, dim), projected, hidden, gated, mlp_out;
  const RopeTable rope = cfg.rope != Rope::None ? rope_table(cfg, grid.grid_h, grid.grid_w) : RopeTable{};
  const int inner = threads_within_chunk(n, options.threads);
  result.layers.resize(static_cast<size_t>(cfg.depth));
  for (int l = 0; l < cfg.depth; ++l) {
    const BlockWeights& b = model.w.blocks[static_cast<size_t>(l)];
    LayerState& state = result.layers[static_cast<size_t>(l)];
    // qkv = self.qkv(self.norm1(x)).reshape(B, N, 3, H, d): columns [Q | K | V], head-major.
    // ResPostBlock (post_norm) feeds x itself and norms the branch's output instead.
    const MatRM& branch_in = cfg.post_norm ? x : normed;
    normed.resize(n, dim);
    state.qkv.resize(n, 3 * dim);
    for_row_chunks(n, options.threads, [&](int r0, int r1) {
      if (!cfg.post_norm) token_norm(cfg, x, b.norm1_w, b.norm1_b, normed, r0, r1);
      block_linear(linears, l, kQkv, branch_in, b.qkv_b, state.qkv, r0, r1, inner);
      // Eva / DINOv3: q, k = rope(q), rope(k) on the patch tokens, before the scores.
      if (cfg.rope != Rope::None) apply_rope(cfg, rope, prefix, state.qkv, r0, r1);
    });
    // NaN scores would look like fully masked rows (zero attention) downstream: stop here instead.
    if (!all_finite(state.qkv))
      throw Error("model '" + cfg.name + "' produces non-finite queries/keys/values (NaN or infinity) in layer " +
                  std::to_string(l) + " on this image: its weights or normalisation are out of range");
    state.key_panels = key_panels(state.qkv.data() + dim, 3 * dim, n, heads, hd);
    state.received.resize(heads, n);
    if (cfg.class_token) state.cls_row.resize(heads, n);
    attend_all_heads(cfg, result, counts_as_query, l, options, state, attn_out);

    projected.resize(n, dim);
    hidden.resize(n, cfg.fc1_rows());
    if (cfg.swiglu) gated.resize(n, cfg.mlp_hidden());
    mlp_out.resize(n, dim);
    // What fc2 reads: act(fc1 x), or silu(gate) * value; then the MLP's own norm when it has one.
    MatRM& fc2_in = cfg.swiglu ? gated : hidden;
    for_row_chunks(n, options.threads, [&](int r0, int r1) {
      // x = x + self.ls1(self.proj(attn_out))          (W^O; ls1 is Identity without LayerScale)
      // ResPostBlock: x = x + self.norm1(self.proj(attn_out))
      // Eva scale_attn_inner / timm scale_attn_norm: x = self.norm(x) before self.proj
      if (cfg.attn_out_norm) token_norm(cfg, attn_out, b.attn_norm_w, b.attn_norm_b, attn_out, r0, r1);
      block_linear(linears, l, kProj, attn_out, b.proj_b, projected, r0, r1, inner);
      if (cfg.post_norm) token_norm(cfg, projected, b.norm1_w, b.norm1_b, projected, r0, r1);
      add_branch(x, projected, b.ls1, r0, r1);
      // x = x + self.ls2(fc2(act(fc1(norm2(x)))))
      // ResPostBlock: x = x + self.norm2(fc2(act(fc1(x))))
      if (!cfg.post_norm) token_norm(cfg, x, b.norm2_w, b.norm2_b, normed, r0, r1);
      if (cfg.swiglu) {
        // timm SwiGLU: fc2(norm(silu(fc1_g x) * fc1_x x)); GluMlp / HF: silu(x1) * x2 of one fc1
        block_linear(linears, l, kFc1, branch_in, b.fc1_b, hidden, r0, r1, inner);
        swiglu_rows(hidden, gated, r0, r1);
      } else {
        block_linear(linears, l, kFc1, branch_in, b.fc1_b, hidden, r0, r1, inner, fc1_epilogue(cfg.act));
        activation_rows(cfg.act, hidden, r0, r1);
      }
      if (cfg.mlp_norm) token_norm(cfg, fc2_in, b.mlp_norm_w, b.mlp_norm_b, fc2_in, r0, r1);
      block_linear(linears, l, kFc2, fc2_in, b.fc2_b, mlp_out, r0, r1, inner);
      if (cfg.post_norm) token_norm(cfg, mlp_out, b.norm2_w, b.norm2_b, mlp_out, r0, r1);
      add_branch(x, mlp_out, b.ls2, r0, r1);
    });
  }
  // x = self.norm(x); Identity when the model norms only its pooled vector (fc_norm, CLIP's
  // post_layernorm), so the tokens are the last block's, as timm forward_features / HF
  // last_hidden_state return them.
  if (!cfg.final_norm) {
    result.output = std::move(x);
  } else {
    result.output.resize(n, dim);
    for_row_chunks(n, options.threads, [&](int r0, int r1) {
      token_norm(cfg, x, model.w.norm_w, model.w.norm_b, result.output, r0, r1);
    });
  }
  // The head's attention pool reads the output tokens (timm forward_head -> pool, HF head).
  if (cfg.attention_pool) attention_pool_forward(model, result, options.threads);
  return result;
}

void attention_row(const VitModel& model, const ForwardResult& result, int layer, int head, int query,
                   float* out) {
  const VitConfig& cfg = model.config;
  if (layer < 0 || layer >= static_cast<int>(result.layers.size()))
    throw Error("layer " + std::to_string(layer) + " is out of range [0, " + std::to_string(result.layers.size()) + ")");
  if (head < 0 || head >= cfg.num_heads)
    throw Error("head " + std::to_string(head) + " is out of range [0, " + std::to_string(cfg.num_heads) + ")");
  if (query < 0 || query >= result.tokens)
    throw Error("query token " + std::to_string(query) + " is out of range [0, " + std::to_string(result.tokens) + ")");
  const int dim = cfg.embed_dim, hd = cfg.head_dim(), n = result.tokens;
  const LayerState& state = result.layers[static_cast<size_t>(layer)];
  // scores_j = q_query . k_j * scale for every key j: O(N d), one row of the (N, N) matrix, with
  // the forward pass's kernels (fast_attention.hpp), so the same numbers as its rows.
  const float* q = state.qkv.row(query).data() + head * hd;
  if (result.precision == Precision::Bf16) {  // its attention's bfloat16 products (attention_bf16.hpp)
    attention_row_bf16(q, state.qkv.data() + dim + head * hd, static_cast<int>(state.qkv.cols()), n, hd,
                       result.score_scale, result.mask, query, out);
    return;
  }
  const Eigen::Index panel_floats = static_cast<Eigen::Index>(aligned_keys(n)) * hd;
  if (state.key_panels.rows() == cfg.num_heads && state.key_panels.cols() == panel_floats) {
    attention_row_fast(q, state.key_panels.row(head).data(), n, hd, result.score_scale, result.mask, query, out);
  } else {  // a result put together without forward(): this head's panels made here
    const MatRM panels = key_panels(state.qkv.data() + dim + head * hd, static_cast<int>(state.qkv.cols()), n, 1, hd);
    attention_row_fast(q, panels.data(), n, hd, result.score_scale, result.mask, query, out);
  }
}

}  // namespace vitlens
