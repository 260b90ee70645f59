// The trainable ViT: the parameter table, then forward and backward as the ops chained together in
// the order of timm's VisionTransformer.forward (forward_features, then forward_head).
#include "core/train/vit_train.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/base/error.hpp"
#include "core/train/train_ops.hpp"

namespace vitlens::train {

const ParamEntry* ParamLayout::find(const std::string& name) const {
  for (const ParamEntry& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

size_t add_param(ParamLayout& layout, const std::string& name, std::vector<int64_t> shape, bool decay) {
  ParamEntry e;
  e.name = name;
  e.shape = std::move(shape);
  e.size = 1;
  for (int64_t s : e.shape) e.size *= static_cast<size_t>(s);
  e.offset = layout.total;
  e.decay = decay;
  layout.total += e.size;
  layout.entries.push_back(e);
  return e.offset;
}

BlockOffsets add_block_params(ParamLayout& layout, const std::string& b, int64_t D, int64_t Hm, bool qkv_bias) {
  BlockOffsets o{};
  o.norm1_w = add_param(layout, b + "norm1.weight", {D}, false);
  o.norm1_b = add_param(layout, b + "norm1.bias", {D}, false);
  o.qkv_w = add_param(layout, b + "attn.qkv.weight", {3 * D, D}, true);
  o.qkv_b = qkv_bias ? add_param(layout, b + "attn.qkv.bias", {3 * D}, false) : std::numeric_limits<size_t>::max();
  o.proj_w = add_param(layout, b + "attn.proj.weight", {D, D}, true);
  o.proj_b = add_param(layout, b + "attn.proj.bias", {D}, false);
  o.norm2_w = add_param(layout, b + "norm2.weight", {D}, false);
  o.norm2_b = add_param(layout, b + "norm2.bias", {D}, false);
  o.fc1_w = add_param(layout, b + "mlp.fc1.weight", {Hm, D}, true);
  o.fc1_b = add_param(layout, b + "mlp.fc1.bias", {Hm}, false);
  o.fc2_w = add_param(layout, b + "mlp.fc2.weight", {D, Hm}, true);
  o.fc2_b = add_param(layout, b + "mlp.fc2.bias", {D}, false);
  return o;
}

std::string untrainable_option(const VitConfig& c) {
  static const std::pair<bool (*)(const VitConfig&), const char*> kOptions[] = {
      {[](const VitConfig& v) { return v.rope != Rope::None; }, "rotary position embeddings"},
      {[](const VitConfig& v) { return !v.pos_embed; }, "no position table"},
      {[](const VitConfig& v) { return v.swiglu; }, "a SwiGLU MLP"},
      {[](const VitConfig& v) { return v.mlp_norm; }, "a norm inside the MLP"},
      {[](const VitConfig& v) { return v.rms_norm; }, "RMSNorm"},
      {[](const VitConfig& v) { return v.attn_out_norm; }, "a norm on the attention output"},
      {[](const VitConfig& v) { return v.post_norm; }, "residual post-norm blocks"},
      {[](const VitConfig& v) { return v.layer_scale; }, "LayerScale"},
      {[](const VitConfig& v) { return v.pre_norm; }, "a norm before the blocks"},
      {[](const VitConfig& v) { return v.dist_token; }, "a distillation token"},
      {[](const VitConfig& v) { return v.register_tokens > 0; }, "register tokens"},
      {[](const VitConfig& v) { return !v.pos_embed_prefix; }, "a position table without rows for the prefix tokens"},
      {[](const VitConfig& v) { return v.act != Activation::Gelu; }, "an activation other than exact GELU"},
      {[](const VitConfig& v) { return !v.final_norm; }, "no final norm over the tokens"},
      {[](const VitConfig& v) { return !v.patch_bias; }, "a patch embedding without bias"},
  };
  for (const auto& [has, what] : kOptions)
    if (has(c)) return std::string("the model has ") + what + ", which vitlens' training does not compute";
  return "";
}

void add_encoder_params(ParamLayout& layout, const VitConfig& c) {
  const std::string why = c.validate();
  if (!why.empty()) throw Error("model config: " + why);
  const std::string untrainable = untrainable_option(c);
  if (!untrainable.empty()) throw Error("model config: " + untrainable);
  const int64_t D = c.embed_dim, P = c.patch_size, Hm = c.mlp_hidden();
  if (c.class_token) layout.cls_token = add_param(layout, "cls_token", {1, 1, D}, false);
  layout.pos_embed = add_param(layout, "pos_embed", {1, c.pos_tokens(), D}, false);
  layout.patch_w = add_param(layout, "patch_embed.proj.weight", {D, 3, P, P}, true);
  layout.patch_b = add_param(layout, "patch_embed.proj.bias", {D}, false);
  for (int i = 0; i < c.depth; ++i)
    layout.blocks.push_back(add_block_params(layout, "blocks." + std::to_string(i) + ".", D, Hm, c.qkv_bias));
  layout.norm_w = add_param(layout, "norm.weight", {D}, false);
  layout.norm_b = add_param(layout, "norm.bias", {D}, false);
}

ParamLayout param_layout(const VitConfig& c, int num_classes) {
  const std::string why = c.validate();
  if (!why.empty()) throw Error("model config: " + why);
  if (num_classes < 2) throw Error("a classifier needs at least 2 classes, got " + std::to_string(num_classes));
  ParamLayout layout;
  add_encoder_params(layout, c);
  layout.head_w = add_param(layout, "head.weight", {num_classes, c.embed_dim}, true);
  layout.head_b = add_param(layout, "head.bias", {num_classes}, false);
  return layout;
}

// ---------------------------------------------------------------------------------------------
// BlockStack

template <class T>
void BlockStack<T>::allocate(int B, int N) {
  if (batch == B && tokens == N) return;
  batch = B;
  tokens = N;
  const size_t R = static_cast<size_t>(B) * N, Ls = static_cast<size_t>(L), Ds = static_cast<size_t>(D);
  const size_t Hms = static_cast<size_t>(Hm), Hs = static_cast<size_t>(H), Ns = static_cast<size_t>(N);
  resid.assign((Ls + 1) * R * Ds, 0);
  ln1.assign(Ls * R * Ds, 0);
  ln1_mean.assign(Ls * R, 0);
  ln1_rstd.assign(Ls * R, 0);
  qkv.assign(Ls * R * 3 * Ds, 0);
  probs.assign(Ls * static_cast<size_t>(B) * Hs * Ns * Ns, 0);
  ctx.assign(Ls * R * Ds, 0);
  mid.assign(Ls * R * Ds, 0);
  ln2.assign(Ls * R * Ds, 0);
  ln2_mean.assign(Ls * R, 0);
  ln2_rstd.assign(Ls * R, 0);
  gelu_slope.assign(Ls * R * Hms, 0);
  gelu.assign(Ls * R * Hms, 0);
  d_resid.assign(R * Ds, 0);
  d_ln.assign(R * Ds, 0);
  d_qkv.assign(R * 3 * Ds, 0);
  d_ctx.assign(R * Ds, 0);
  d_hidden.assign(R * Hms, 0);
}

template <class T>
void BlockStack<T>::forward(const T* w, const uint8_t* mask, int threads) {
  const int B = batch, N = tokens, R = B * N;
  const T scale = T(1) / std::sqrt(static_cast<T>(D / H));
  const size_t RD = static_cast<size_t>(R) * D;
  if (drop_scale) branch_out.resize(RD);
  for (int l = 0; l < L; ++l) {
    const BlockOffsets& o = offsets[static_cast<size_t>(l)];
    const T* x = resid.data() + l * RD;
    T* ln1_l = ln1.data() + l * RD;
    T* qkv_l = qkv.data() + l * RD * 3;
    T* probs_l = probs.data() + static_cast<size_t>(l) * B * H * N * N;
    T* ctx_l = ctx.data() + l * RD;
    T* mid_l = mid.data() + l * RD;
    T* ln2_l = ln2.data() + l * RD;
    T* slope_l = gelu_slope.data() + static_cast<size_t>(l) * R * Hm;
    T* gelu_l = gelu.data() + static_cast<size_t>(l) * R * Hm;
    // x = x + self.attn(self.norm1(x))
    layernorm_forward(x, w + o.norm1_w, w + o.norm1_b, eps, R, D, ln1_l, ln1_mean.data() + l * R,
                      ln1_rstd.data() + l * R, threads);
    linear_forward(ln1_l, w + o.qkv_w, qkv_bias ? w + o.qkv_b : nullptr, R, D, 3 * D, qkv_l, threads);
    attention_forward(qkv_l, mask, B, N, D, H, scale, probs_l, ctx_l, threads);
    // The residual add is the product's epilogue; with drop path the branch goes through `branch_out`.
    const int64_t M = static_cast<int64_t>(N) * D;
    if (drop_scale) {
      linear_forward(ctx_l, w + o.proj_w, w + o.proj_b, R, D, D, branch_out.data(), threads);
      drop_path_forward(x, branch_out.data(), drop_scale + (2 * l) * B, B, M, mid_l, threads);
    } else {
      linear_residual_forward(ctx_l, w + o.proj_w, w + o.proj_b, x, R, D, D, mid_l, threads);
    }
    // x = x + self.mlp(self.norm2(x))
    layernorm_forward(mid_l, w + o.norm2_w, w + o.norm2_b, eps, R, D, ln2_l, ln2_mean.data() + l * R,
                      ln2_rstd.data() + l * R, threads);
    linear_gelu_forward(ln2_l, w + o.fc1_w, w + o.fc1_b, R, D, Hm, gelu_l, slope_l, threads);
    T* next = resid.data() + (l + 1) * RD;
    if (drop_scale) {
      linear_forward(gelu_l, w + o.fc2_w, w + o.fc2_b, R, Hm, D, branch_out.data(), threads);
      drop_path_forward(mid_l, branch_out.data(), drop_scale + (2 * l + 1) * B, B, M, next, threads);
    } else {
      linear_residual_forward(gelu_l, w + o.fc2_w, w + o.fc2_b, mid_l, R, Hm, D, next, threads);
    }
  }
}

template <class T>
void BlockStack<T>::backward(const T* w, T* g, int threads) {
  const int B = batch, N = tokens, R = B * N;
  const T scale = T(1) / std::sqrt(static_cast<T>(D / H));
  const size_t RD = static_cast<size_t>(R) * D;
  // Every scratch gradient below has one producer, which writes it (write_dinp = true, and
  // linear_gelu_backward and attention_backward, which always write): no buffer is cleared per block.
  // With drop path each branch reads d_branch = scale * d_resid instead of d_resid itself.
  const int64_t M = static_cast<int64_t>(N) * D;
  if (drop_scale) d_branch.resize(RD);
  auto branch_grad = [&](int branch) -> const T* {
    if (!drop_scale) return d_resid.data();
    drop_path_backward(d_resid.data(), drop_scale + branch * B, B, M, d_branch.data(), threads);
    return d_branch.data();
  };
  for (int l = L - 1; l >= 0; --l) {
    const BlockOffsets& o = offsets[static_cast<size_t>(l)];
    const T* x = resid.data() + l * RD;
    const T* ln1_l = ln1.data() + l * RD;
    const T* qkv_l = qkv.data() + l * RD * 3;
    const T* probs_l = probs.data() + static_cast<size_t>(l) * B * H * N * N;
    const T* ctx_l = ctx.data() + l * RD;
    const T* mid_l = mid.data() + l * RD;
    const T* ln2_l = ln2.data() + l * RD;
    const T* slope_l = gelu_slope.data() + static_cast<size_t>(l) * R * Hm;
    const T* gelu_l = gelu.data() + static_cast<size_t>(l) * R * Hm;
    // d_resid holds d loss / d resid[l+1], resid[l+1] = mid + mlp: mid's gradient is that plus the
    // MLP branch's. The branch reads d_resid (fc2's backward) before norm2's backward adds its
    // share, so the sum builds up in d_resid itself (llm.c's residual_backward without a copy).
    // mlp branch: fc2(GELU(fc1(norm2(mid))))
    linear_gelu_backward(branch_grad(2 * l + 1), gelu_l, slope_l, w + o.fc2_w, R, Hm, D, d_hidden.data(), g + o.fc2_w,
                         g + o.fc2_b, threads);  // writes d_hidden
    linear_backward(d_hidden.data(), ln2_l, w + o.fc1_w, R, D, Hm, d_ln.data(), g + o.fc1_w, g + o.fc1_b, threads,
                    true);
    layernorm_backward(d_ln.data(), mid_l, w + o.norm2_w, ln2_mean.data() + l * R, ln2_rstd.data() + l * R, R, D,
                       d_resid.data(), g + o.norm2_w, g + o.norm2_b, threads);
    // d_resid = d loss / d mid now, mid = x + proj(attn(norm1(x))): the same again, proj's backward
    // reads it before norm1's backward adds the attention branch's share of x's gradient.
    linear_backward(branch_grad(2 * l), ctx_l, w + o.proj_w, R, D, D, d_ctx.data(), g + o.proj_w, g + o.proj_b,
                    threads, true);
    attention_backward(d_ctx.data(), qkv_l, probs_l, B, N, D, H, scale, d_qkv.data(), threads);  // writes d_qkv
    linear_backward(d_qkv.data(), ln1_l, w + o.qkv_w, R, D, 3 * D, d_ln.data(), g + o.qkv_w,
                    qkv_bias ? g + o.qkv_b : nullptr, threads, true);
    layernorm_backward(d_ln.data(), x, w + o.norm1_w, ln1_mean.data() + l * R, ln1_rstd.data() + l * R, R, D,
                       d_resid.data(), g + o.norm1_w, g + o.norm1_b, threads);
  }
}

template <class T>
VitNet<T>::VitNet(const VitConfig& config, int num_classes)
    : config_(config), num_classes_(num_classes), layout_(param_layout(config, num_classes)) {
  blocks_.L = config.depth;
  blocks_.D = config.embed_dim;
  blocks_.H = config.num_heads;
  blocks_.Hm = config.mlp_hidden();
  blocks_.qkv_bias = config.qkv_bias;
  blocks_.eps = static_cast<T>(config.norm_eps);
  blocks_.offsets = layout_.blocks;
  params.assign(layout_.total, T(0));
  grads.assign(layout_.total, T(0));
}

template <class T>
T* VitNet<T>::param(const std::string& name) {
  const ParamEntry* e = layout_.find(name);
  if (!e) throw Error("no parameter named '" + name + "'");
  return params.data() + e->offset;
}

template <class T>
T* VitNet<T>::grad(const std::string& name) {
  const ParamEntry* e = layout_.find(name);
  if (!e) throw Error("no parameter named '" + name + "'");
  return grads.data() + e->offset;
}

template <class T>
void VitNet<T>::zero_grad() {
  std::fill(grads.begin(), grads.end(), T(0));
}

template <class T>
void VitNet<T>::allocate(int batch) {
  if (acts_.batch == batch) return;
  const size_t B = static_cast<size_t>(batch);
  const size_t N = static_cast<size_t>(tokens()), D = static_cast<size_t>(config_.embed_dim);
  const size_t Np = static_cast<size_t>(config_.grid_h() * config_.grid_w());
  const size_t K = static_cast<size_t>(config_.patch_values()), C = static_cast<size_t>(num_classes_);
  const size_t R = B * N;
  Activations<T>& a = acts_;
  a.batch = batch;
  a.patches.assign(B * Np * K, 0);
  a.tokens.assign(B * Np * D, 0);
  a.out.assign(R * D, 0);
  a.out_mean.assign(R, 0);
  a.out_rstd.assign(R, 0);
  a.pooled.assign(B * D, 0);
  a.logits.assign(B * C, 0);
  a.probs_out.assign(B * C, 0);
  a.d_tokens.assign(B * Np * D, 0);
  a.d_patches.assign(B * Np * K, 0);
  a.d_out.assign(R * D, 0);
  a.d_pooled.assign(B * D, 0);
  a.d_logits.assign(B * C, 0);
  blocks_.allocate(batch, tokens());
  images_.assign(B * 3 * static_cast<size_t>(config_.img_h) * static_cast<size_t>(config_.img_w), 0);
  d_images_.assign(images_.size(), 0);
  labels_.assign(B, 0);
  key_allowed_.clear();
}

template <class T>
T VitNet<T>::forward(const T* images, const int32_t* labels, const uint8_t* key_allowed, int batch) {
  if (batch < 1) throw Error("forward: empty batch");
  allocate(batch);
  const VitConfig& c = config_;
  const int B = batch, D = c.embed_dim, P = c.patch_size;
  const int N = tokens(), Np = c.grid_h() * c.grid_w(), K = c.patch_values();
  const int C = num_classes_, R = B * N;
  const T eps = static_cast<T>(c.norm_eps);
  const T* w = params.data();
  Activations<T>& a = acts_;

  std::copy(images, images + images_.size(), images_.begin());
  if (labels) std::copy(labels, labels + B, labels_.begin());
  if (key_allowed) key_allowed_.assign(key_allowed, key_allowed + static_cast<size_t>(B) * N);
  else key_allowed_.clear();
  const uint8_t* mask = key_allowed_.empty() ? nullptr : key_allowed_.data();

  // x = self.patch_embed(x); x = self._pos_embed(x)
  patchify_forward(images, B, c.img_h, c.img_w, P, a.patches.data());
  linear_forward(a.patches.data(), w + layout_.patch_w, w + layout_.patch_b, B * Np, K, D, a.tokens.data(), threads);
  embed_forward(a.tokens.data(), c.class_token ? w + layout_.cls_token : nullptr, w + layout_.pos_embed, B, Np, D,
                blocks_.input());
  // x = self.blocks(x)
  if (!drop_scale.empty() && drop_scale.size() != static_cast<size_t>(2) * c.depth * B)
    throw Error("forward: drop_scale holds " + std::to_string(drop_scale.size()) + " values, not 2 * depth * batch = " +
                std::to_string(2 * c.depth * B));
  drop_used_ = drop_scale;  // backward reads this forward's scales, whatever drop_scale holds by then
  blocks_.drop_scale = drop_used_.empty() ? nullptr : drop_used_.data();
  blocks_.forward(w, mask, threads);
  // x = self.norm(x); forward_head: pool, then self.head
  layernorm_forward(blocks_.output(), w + layout_.norm_w, w + layout_.norm_b, eps, R, D, a.out.data(),
                    a.out_mean.data(), a.out_rstd.data(), threads);
  pool_forward(a.out.data(), B, N, D, c.class_token, a.pooled.data());
  linear_forward(a.pooled.data(), w + layout_.head_w, w + layout_.head_b, B, D, C, a.logits.data(), threads);
  if (!labels) return T(0);
  for (int b = 0; b < B; ++b)
    if (labels[b] < 0 || labels[b] >= C)
      throw Error("label " + std::to_string(labels[b]) + " is outside [0, " + std::to_string(C) + ")");
  return crossentropy_forward(a.logits.data(), labels_.data(), B, C, label_smoothing, a.probs_out.data());
}

template <class T>
void VitNet<T>::backward(bool want_input_grad) {
  Activations<T>& a = acts_;
  if (a.batch < 1) throw Error("backward before forward");
  const VitConfig& c = config_;
  const int B = a.batch, D = c.embed_dim, P = c.patch_size;
  const int N = tokens(), Np = c.grid_h() * c.grid_w(), K = c.patch_values();
  const int C = num_classes_, R = B * N;
  const T* w = params.data();
  T* g = grads.data();
  auto zero = [](std::vector<T>& v) { std::fill(v.begin(), v.end(), T(0)); };

  // loss -> logits -> pooled -> final norm
  zero(a.d_logits);
  crossentropy_backward(a.probs_out.data(), labels_.data(), B, C, label_smoothing, T(1), a.d_logits.data());
  zero(a.d_pooled);
  linear_backward(a.d_logits.data(), a.pooled.data(), w + layout_.head_w, B, D, C, a.d_pooled.data(),
                  g + layout_.head_w, g + layout_.head_b, threads);
  zero(a.d_out);
  pool_backward(a.d_pooled.data(), B, N, D, c.class_token, a.d_out.data());
  zero(blocks_.d_resid);
  layernorm_backward(a.d_out.data(), blocks_.output(), w + layout_.norm_w, a.out_mean.data(), a.out_rstd.data(), R,
                     D, blocks_.d_resid.data(), g + layout_.norm_w, g + layout_.norm_b, threads);
  blocks_.backward(w, g, threads);
  // embedding: blocks_.d_resid = d loss / d resid[0]
  zero(a.d_tokens);
  embed_backward(blocks_.d_resid.data(), B, Np, D, c.class_token, a.d_tokens.data(), g + layout_.cls_token,
                 g + layout_.pos_embed);
  if (want_input_grad) zero(a.d_patches);
  linear_backward(a.d_tokens.data(), a.patches.data(), w + layout_.patch_w, B * Np, K, D,
                  want_input_grad ? a.d_patches.data() : nullptr, g + layout_.patch_w, g + layout_.patch_b, threads);
  if (want_input_grad) {
    zero(d_images_);
    patchify_backward(a.d_patches.data(), B, c.img_h, c.img_w, P, d_images_.data());
  }
}

template struct BlockStack<float>;
template struct BlockStack<double>;
template class VitNet<float>;
template class VitNet<double>;

}  // namespace vitlens::train
