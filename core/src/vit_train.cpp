// The trainable ViT: the parameter table, then forward and backward as the ops chained together in
// the order of timm's VisionTransformer.forward (forward_features, then forward_head).
#include "vitlens/vit_train.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "vitlens/error.hpp"
#include "vitlens/train_ops.hpp"

namespace vitlens::train {

const ParamEntry* ParamLayout::find(const std::string& name) const {
  for (const ParamEntry& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

ParamLayout param_layout(const VitConfig& c, int num_classes) {
  const std::string why = c.validate();
  if (!why.empty()) throw Error("model config: " + why);
  if (num_classes < 2) throw Error("a classifier needs at least 2 classes, got " + std::to_string(num_classes));
  ParamLayout layout;
  const int64_t D = c.embed_dim, P = c.patch_size, Hm = c.mlp_hidden();
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool decay) {
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
  };
  if (c.class_token) layout.cls_token = add("cls_token", {1, 1, D}, false);
  layout.pos_embed = add("pos_embed", {1, c.pos_tokens(), D}, false);
  layout.patch_w = add("patch_embed.proj.weight", {D, 3, P, P}, true);
  layout.patch_b = add("patch_embed.proj.bias", {D}, false);
  for (int i = 0; i < c.depth; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    BlockOffsets o{};
    o.norm1_w = add(b + "norm1.weight", {D}, false);
    o.norm1_b = add(b + "norm1.bias", {D}, false);
    o.qkv_w = add(b + "attn.qkv.weight", {3 * D, D}, true);
    o.qkv_b = c.qkv_bias ? add(b + "attn.qkv.bias", {3 * D}, false) : std::numeric_limits<size_t>::max();
    o.proj_w = add(b + "attn.proj.weight", {D, D}, true);
    o.proj_b = add(b + "attn.proj.bias", {D}, false);
    o.norm2_w = add(b + "norm2.weight", {D}, false);
    o.norm2_b = add(b + "norm2.bias", {D}, false);
    o.fc1_w = add(b + "mlp.fc1.weight", {Hm, D}, true);
    o.fc1_b = add(b + "mlp.fc1.bias", {Hm}, false);
    o.fc2_w = add(b + "mlp.fc2.weight", {D, Hm}, true);
    o.fc2_b = add(b + "mlp.fc2.bias", {D}, false);
    layout.blocks.push_back(o);
  }
  layout.norm_w = add("norm.weight", {D}, false);
  layout.norm_b = add("norm.bias", {D}, false);
  layout.head_w = add("head.weight", {num_classes, D}, true);
  layout.head_b = add("head.bias", {num_classes}, false);
  return layout;
}

template <class T>
VitNet<T>::VitNet(const VitConfig& config, int num_classes)
    : config_(config), num_classes_(num_classes), layout_(param_layout(config, num_classes)) {
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
  const size_t B = static_cast<size_t>(batch), L = static_cast<size_t>(config_.depth);
  const size_t N = static_cast<size_t>(tokens()), D = static_cast<size_t>(config_.embed_dim);
  const size_t Np = static_cast<size_t>(config_.grid_h() * config_.grid_w());
  const size_t K = static_cast<size_t>(config_.patch_values()), Hm = static_cast<size_t>(config_.mlp_hidden());
  const size_t H = static_cast<size_t>(config_.num_heads), C = static_cast<size_t>(num_classes_);
  const size_t R = B * N;
  Activations<T>& a = acts_;
  a.batch = batch;
  a.patches.assign(B * Np * K, 0);
  a.tokens.assign(B * Np * D, 0);
  a.resid.assign((L + 1) * R * D, 0);
  a.ln1.assign(L * R * D, 0);
  a.ln1_mean.assign(L * R, 0);
  a.ln1_rstd.assign(L * R, 0);
  a.qkv.assign(L * R * 3 * D, 0);
  a.probs.assign(L * B * H * N * N, 0);
  a.ctx.assign(L * R * D, 0);
  a.attn_proj.assign(L * R * D, 0);
  a.mid.assign(L * R * D, 0);
  a.ln2.assign(L * R * D, 0);
  a.ln2_mean.assign(L * R, 0);
  a.ln2_rstd.assign(L * R, 0);
  a.fc1.assign(L * R * Hm, 0);
  a.gelu.assign(L * R * Hm, 0);
  a.mlp.assign(L * R * D, 0);
  a.out.assign(R * D, 0);
  a.out_mean.assign(R, 0);
  a.out_rstd.assign(R, 0);
  a.pooled.assign(B * D, 0);
  a.logits.assign(B * C, 0);
  a.probs_out.assign(B * C, 0);
  a.d_resid.assign(R * D, 0);
  a.d_mid.assign(R * D, 0);
  a.d_ln.assign(R * D, 0);
  a.d_qkv.assign(R * 3 * D, 0);
  a.d_ctx.assign(R * D, 0);
  a.d_hidden.assign(R * Hm, 0);
  a.d_gelu.assign(R * Hm, 0);
  a.d_probs.assign(B * H * N * N, 0);
  a.d_tokens.assign(B * Np * D, 0);
  a.d_patches.assign(B * Np * K, 0);
  a.d_out.assign(R * D, 0);
  a.d_pooled.assign(B * D, 0);
  a.d_logits.assign(B * C, 0);
  d_branch_.assign(R * D, 0);
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
  const int B = batch, L = c.depth, D = c.embed_dim, H = c.num_heads, P = c.patch_size;
  const int N = tokens(), Np = c.grid_h() * c.grid_w(), K = c.patch_values(), Hm = c.mlp_hidden();
  const int C = num_classes_, R = B * N;
  const T eps = static_cast<T>(c.norm_eps);
  const T scale = T(1) / std::sqrt(static_cast<T>(c.head_dim()));
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
                a.resid.data());

  const size_t RD = static_cast<size_t>(R) * D;
  for (int l = 0; l < L; ++l) {
    const BlockOffsets& o = layout_.blocks[static_cast<size_t>(l)];
    const T* x = a.resid.data() + l * RD;
    T* ln1 = a.ln1.data() + l * RD;
    T* qkv = a.qkv.data() + l * RD * 3;
    T* probs = a.probs.data() + static_cast<size_t>(l) * B * H * N * N;
    T* ctx = a.ctx.data() + l * RD;
    T* proj = a.attn_proj.data() + l * RD;
    T* mid = a.mid.data() + l * RD;
    T* ln2 = a.ln2.data() + l * RD;
    T* fc1 = a.fc1.data() + static_cast<size_t>(l) * R * Hm;
    T* gelu = a.gelu.data() + static_cast<size_t>(l) * R * Hm;
    T* mlp = a.mlp.data() + l * RD;
    // x = x + self.attn(self.norm1(x))
    layernorm_forward(x, w + o.norm1_w, w + o.norm1_b, eps, R, D, ln1, a.ln1_mean.data() + l * R,
                      a.ln1_rstd.data() + l * R, threads);
    linear_forward(ln1, w + o.qkv_w, c.qkv_bias ? w + o.qkv_b : nullptr, R, D, 3 * D, qkv, threads);
    attention_forward(qkv, mask, B, N, D, H, scale, probs, ctx, threads);
    linear_forward(ctx, w + o.proj_w, w + o.proj_b, R, D, D, proj, threads);
    residual_forward(x, proj, static_cast<int64_t>(RD), mid);
    // x = x + self.mlp(self.norm2(x))
    layernorm_forward(mid, w + o.norm2_w, w + o.norm2_b, eps, R, D, ln2, a.ln2_mean.data() + l * R,
                      a.ln2_rstd.data() + l * R, threads);
    linear_forward(ln2, w + o.fc1_w, w + o.fc1_b, R, D, Hm, fc1, threads);
    gelu_forward(fc1, static_cast<int64_t>(R) * Hm, gelu, threads);
    linear_forward(gelu, w + o.fc2_w, w + o.fc2_b, R, Hm, D, mlp, threads);
    residual_forward(mid, mlp, static_cast<int64_t>(RD), a.resid.data() + (l + 1) * RD);
  }
  // x = self.norm(x); forward_head: pool, then self.head
  layernorm_forward(a.resid.data() + L * RD, w + layout_.norm_w, w + layout_.norm_b, eps, R, D, a.out.data(),
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
  const int B = a.batch, L = c.depth, D = c.embed_dim, H = c.num_heads, P = c.patch_size;
  const int N = tokens(), Np = c.grid_h() * c.grid_w(), K = c.patch_values(), Hm = c.mlp_hidden();
  const int C = num_classes_, R = B * N;
  const T scale = T(1) / std::sqrt(static_cast<T>(c.head_dim()));
  const T* w = params.data();
  T* g = grads.data();
  const size_t RD = static_cast<size_t>(R) * D;
  auto zero = [](std::vector<T>& v) { std::fill(v.begin(), v.end(), T(0)); };

  // loss -> logits -> pooled -> final norm
  zero(a.d_logits);
  crossentropy_backward(a.probs_out.data(), labels_.data(), B, C, label_smoothing, T(1), a.d_logits.data());
  zero(a.d_pooled);
  linear_backward(a.d_logits.data(), a.pooled.data(), w + layout_.head_w, B, D, C, a.d_pooled.data(),
                  g + layout_.head_w, g + layout_.head_b, threads);
  zero(a.d_out);
  pool_backward(a.d_pooled.data(), B, N, D, c.class_token, a.d_out.data());
  zero(a.d_resid);
  layernorm_backward(a.d_out.data(), a.resid.data() + L * RD, w + layout_.norm_w, a.out_mean.data(),
                     a.out_rstd.data(), R, D, a.d_resid.data(), g + layout_.norm_w, g + layout_.norm_b, threads);

  for (int l = L - 1; l >= 0; --l) {
    const BlockOffsets& o = layout_.blocks[static_cast<size_t>(l)];
    const T* x = a.resid.data() + l * RD;
    const T* ln1 = a.ln1.data() + l * RD;
    const T* qkv = a.qkv.data() + l * RD * 3;
    const T* probs = a.probs.data() + static_cast<size_t>(l) * B * H * N * N;
    const T* ctx = a.ctx.data() + l * RD;
    const T* mid = a.mid.data() + l * RD;
    const T* ln2 = a.ln2.data() + l * RD;
    const T* fc1 = a.fc1.data() + static_cast<size_t>(l) * R * Hm;
    const T* gelu = a.gelu.data() + static_cast<size_t>(l) * R * Hm;
    // d_resid holds d loss / d resid[l+1] = d(mid + mlp): both get it.
    zero(a.d_mid);
    zero(d_branch_);
    residual_backward(a.d_resid.data(), static_cast<int64_t>(RD), a.d_mid.data(), d_branch_.data());
    // mlp branch: fc2(GELU(fc1(norm2(mid))))
    zero(a.d_gelu);
    linear_backward(d_branch_.data(), gelu, w + o.fc2_w, R, Hm, D, a.d_gelu.data(), g + o.fc2_w, g + o.fc2_b,
                    threads);
    zero(a.d_hidden);
    gelu_backward(a.d_gelu.data(), fc1, static_cast<int64_t>(R) * Hm, a.d_hidden.data(), threads);
    zero(a.d_ln);
    linear_backward(a.d_hidden.data(), ln2, w + o.fc1_w, R, D, Hm, a.d_ln.data(), g + o.fc1_w, g + o.fc1_b, threads);
    layernorm_backward(a.d_ln.data(), mid, w + o.norm2_w, a.ln2_mean.data() + l * R, a.ln2_rstd.data() + l * R, R,
                       D, a.d_mid.data(), g + o.norm2_w, g + o.norm2_b, threads);
    // d_mid = d loss / d mid = d(x + proj(attn(norm1(x)))): both get it.
    zero(a.d_resid);
    zero(d_branch_);
    residual_backward(a.d_mid.data(), static_cast<int64_t>(RD), a.d_resid.data(), d_branch_.data());
    zero(a.d_ctx);
    linear_backward(d_branch_.data(), ctx, w + o.proj_w, R, D, D, a.d_ctx.data(), g + o.proj_w, g + o.proj_b,
                    threads);
    zero(a.d_qkv);
    attention_backward(a.d_ctx.data(), qkv, probs, B, N, D, H, scale, a.d_probs.data(), a.d_qkv.data(), threads);
    zero(a.d_ln);
    linear_backward(a.d_qkv.data(), ln1, w + o.qkv_w, R, D, 3 * D, a.d_ln.data(), g + o.qkv_w,
                    c.qkv_bias ? g + o.qkv_b : nullptr, threads);
    layernorm_backward(a.d_ln.data(), x, w + o.norm1_w, a.ln1_mean.data() + l * R, a.ln1_rstd.data() + l * R, R, D,
                       a.d_resid.data(), g + o.norm1_w, g + o.norm1_b, threads);
  }
  // embedding: d_resid = d loss / d resid[0]
  zero(a.d_tokens);
  embed_backward(a.d_resid.data(), B, Np, D, c.class_token, a.d_tokens.data(), g + layout_.cls_token,
                 g + layout_.pos_embed);
  if (want_input_grad) zero(a.d_patches);
  linear_backward(a.d_tokens.data(), a.patches.data(), w + layout_.patch_w, B * Np, K, D,
                  want_input_grad ? a.d_patches.data() : nullptr, g + layout_.patch_w, g + layout_.patch_b, threads);
  if (want_input_grad) {
    zero(d_images_);
    patchify_backward(a.d_patches.data(), B, c.img_h, c.img_w, P, d_images_.data());
  }
}

template class VitNet<float>;
template class VitNet<double>;

}  // namespace vitlens::train
