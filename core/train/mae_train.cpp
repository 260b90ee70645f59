// Masked-autoencoder pretraining: the MAE ops and the net (encoder = VitNet's blocks on the visible
// tokens, a light decoder on all tokens). The objective over a photo corpus: mae_objective.cpp.
#include "core/train/mae_train.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/base/error.hpp"
#include "core/train/train_ops.hpp"

namespace vitlens::train {

// ---------------------------------------------------------------------------------------------
// gather_rows: x_masked = torch.gather(x, dim=1, index=ids_keep.unsqueeze(-1).repeat(1, 1, D))

template <class T>
void gather_rows_forward(const T* inp, const int32_t* idx, int B, int N, int M, int D, T* out) {
  for (int b = 0; b < B; ++b)
    for (int m = 0; m < M; ++m) {
      const T* src = inp + (static_cast<int64_t>(b) * N + idx[static_cast<int64_t>(b) * M + m]) * D;
      std::copy(src, src + D, out + (static_cast<int64_t>(b) * M + m) * D);
    }
}

template <class T>
void gather_rows_backward(const T* dout, const int32_t* idx, int B, int N, int M, int D, T* dinp) {
  for (int b = 0; b < B; ++b)
    for (int m = 0; m < M; ++m) {
      const T* src = dout + (static_cast<int64_t>(b) * M + m) * D;
      T* dst = dinp + (static_cast<int64_t>(b) * N + idx[static_cast<int64_t>(b) * M + m]) * D;
      for (int c = 0; c < D; ++c) dst[c] += src[c];
    }
}

// ---------------------------------------------------------------------------------------------
// unshuffle: mask_tokens = self.mask_token.repeat(...); x_ = torch.cat([x, mask_tokens], dim=1);
// x_ = torch.gather(x_, dim=1, index=ids_restore...) -- written as "place row m at idx[m]".

template <class T>
void unshuffle_forward(const T* inp, const int32_t* idx, const T* mask_token, int B, int M, int N, int D, T* out) {
  for (int b = 0; b < B; ++b) {
    T* ob = out + static_cast<int64_t>(b) * N * D;
    for (int n = 0; n < N; ++n) std::copy(mask_token, mask_token + D, ob + static_cast<int64_t>(n) * D);
    for (int m = 0; m < M; ++m) {
      const T* src = inp + (static_cast<int64_t>(b) * M + m) * D;
      std::copy(src, src + D, ob + static_cast<int64_t>(idx[static_cast<int64_t>(b) * M + m]) * D);
    }
  }
}

template <class T>
void unshuffle_backward(const T* dout, const int32_t* idx, int B, int M, int N, int D, T* dinp, T* dmask_token) {
  std::vector<uint8_t> placed(static_cast<size_t>(N));
  for (int b = 0; b < B; ++b) {
    const T* db = dout + static_cast<int64_t>(b) * N * D;
    std::fill(placed.begin(), placed.end(), uint8_t(0));
    for (int m = 0; m < M; ++m) {
      const int n = idx[static_cast<int64_t>(b) * M + m];
      placed[static_cast<size_t>(n)] = 1;
      T* dst = dinp + (static_cast<int64_t>(b) * M + m) * D;
      for (int c = 0; c < D; ++c) dst[c] += db[static_cast<int64_t>(n) * D + c];
    }
    for (int n = 0; n < N; ++n)
      if (!placed[static_cast<size_t>(n)])
        for (int c = 0; c < D; ++c) dmask_token[c] += db[static_cast<int64_t>(n) * D + c];
  }
}

// ---------------------------------------------------------------------------------------------
// norm_pix targets: mean = target.mean(dim=-1); var = target.var(dim=-1) (unbiased);
// target = (target - mean) / (var + 1.e-6)**.5

template <class T>
void normalized_patch_targets(const T* patches, int R, int K, T eps, T* target) {
  for (int r = 0; r < R; ++r) {
    const T* x = patches + static_cast<int64_t>(r) * K;
    T* t = target + static_cast<int64_t>(r) * K;
    T mean = 0;
    for (int k = 0; k < K; ++k) mean += x[k];
    mean /= static_cast<T>(K);
    T var = 0;
    for (int k = 0; k < K; ++k) var += (x[k] - mean) * (x[k] - mean);
    var /= static_cast<T>(K - 1);
    const T inv = T(1) / std::sqrt(var + eps);
    for (int k = 0; k < K; ++k) t[k] = (x[k] - mean) * inv;
  }
}

// ---------------------------------------------------------------------------------------------
// masked_mse: loss = (pred - target) ** 2; loss = loss.mean(dim=-1); loss = (loss * mask).sum() / mask.sum()

template <class T>
T masked_mse_forward(const T* pred, const T* target, const uint8_t* hidden, int B, int prefix, int Np, int K) {
  T sum = 0;
  int64_t count = 0;
  for (int b = 0; b < B; ++b)
    for (int p = 0; p < Np; ++p) {
      if (!hidden[static_cast<int64_t>(b) * Np + p]) continue;
      const T* y = pred + (static_cast<int64_t>(b) * (prefix + Np) + prefix + p) * K;
      const T* t = target + (static_cast<int64_t>(b) * Np + p) * K;
      T row = 0;
      for (int k = 0; k < K; ++k) row += (y[k] - t[k]) * (y[k] - t[k]);
      sum += row / static_cast<T>(K);
      ++count;
    }
  return count > 0 ? sum / static_cast<T>(count) : T(0);
}

template <class T>
void masked_mse_backward(const T* pred, const T* target, const uint8_t* hidden, int B, int prefix, int Np, int K,
                         T dloss, T* dpred) {
  int64_t count = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(B) * Np; ++i) count += hidden[i] ? 1 : 0;
  if (count == 0) return;
  const T f = T(2) * dloss / (static_cast<T>(K) * static_cast<T>(count));
  for (int b = 0; b < B; ++b)
    for (int p = 0; p < Np; ++p) {
      if (!hidden[static_cast<int64_t>(b) * Np + p]) continue;
      const int64_t row = static_cast<int64_t>(b) * (prefix + Np) + prefix + p;
      const T* y = pred + row * K;
      const T* t = target + (static_cast<int64_t>(b) * Np + p) * K;
      T* d = dpred + row * K;
      for (int k = 0; k < K; ++k) d[k] += f * (y[k] - t[k]);
    }
}

void random_keep(Rng& rng, int B, int Np, int Nv, int32_t* keep) {
  std::vector<double> noise(static_cast<size_t>(Np));
  std::vector<int32_t> order(static_cast<size_t>(Np));
  for (int b = 0; b < B; ++b) {
    for (double& v : noise) v = rng.uniform();
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t i, int32_t j) {
      return noise[static_cast<size_t>(i)] < noise[static_cast<size_t>(j)];
    });
    std::copy(order.begin(), order.begin() + Nv, keep + static_cast<int64_t>(b) * Nv);
  }
}

#define VITLENS_MAE_OPS(T)                                                                             \
  template void gather_rows_forward<T>(const T*, const int32_t*, int, int, int, int, T*);             \
  template void gather_rows_backward<T>(const T*, const int32_t*, int, int, int, int, T*);            \
  template void unshuffle_forward<T>(const T*, const int32_t*, const T*, int, int, int, int, T*);     \
  template void unshuffle_backward<T>(const T*, const int32_t*, int, int, int, int, T*, T*);          \
  template void normalized_patch_targets<T>(const T*, int, int, T, T*);                                \
  template T masked_mse_forward<T>(const T*, const T*, const uint8_t*, int, int, int, int);            \
  template void masked_mse_backward<T>(const T*, const T*, const uint8_t*, int, int, int, int, T, T*);
VITLENS_MAE_OPS(float)
VITLENS_MAE_OPS(double)
#undef VITLENS_MAE_OPS

// ---------------------------------------------------------------------------------------------
// MaeShape and the parameter table

int MaeShape::visible(int Np) const { return static_cast<int>(Np * (1.0 - mask_ratio)); }

std::string MaeShape::validate(const VitConfig& c) const {
  std::ostringstream why;
  const int Np = c.grid_h() * c.grid_w();
  if (!(mask_ratio > 0.0 && mask_ratio < 1.0)) why << "mask ratio " << mask_ratio << " is not in (0, 1)";
  else if (decoder_dim < 1 || decoder_dim > 4096) why << "decoder width " << decoder_dim << " is not in [1, 4096]";
  else if (decoder_depth < 1 || decoder_depth > 64) why << "decoder depth " << decoder_depth << " is not in [1, 64]";
  else if (decoder_heads < 1 || decoder_dim % decoder_heads != 0)
    why << "decoder width " << decoder_dim << " is not divisible by " << decoder_heads << " heads";
  else if (!c.class_token || c.dist_token || c.register_tokens != 0 || !c.pos_embed_prefix)
    why << "MAE here needs a class token and no other prefix tokens";
  else if (visible(Np) < 1 || visible(Np) >= Np)
    why << "mask ratio " << mask_ratio << " leaves " << visible(Np) << " of " << Np
        << " patches visible; at least one must be visible and one hidden";
  return why.str();
}

nlohmann::json MaeShape::to_json() const {
  return {{"decoder_dim", decoder_dim}, {"decoder_depth", decoder_depth}, {"decoder_heads", decoder_heads},
          {"mask_ratio", mask_ratio}};
}

MaeShape MaeShape::from_json(const nlohmann::json& j) {
  MaeShape s;
  try {
    s.decoder_dim = j.at("decoder_dim").get<int>();
    s.decoder_depth = j.at("decoder_depth").get<int>();
    s.decoder_heads = j.at("decoder_heads").get<int>();
    s.mask_ratio = j.at("mask_ratio").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("MAE shape: ") + e.what());
  }
  return s;
}

bool is_decoder_param(const std::string& name) {
  return name == "mask_token" || name.rfind("decoder_", 0) == 0;
}

ParamLayout mae_param_layout(const VitConfig& c, const MaeShape& shape, MaeOffsets* off) {
  const std::string why = c.validate();
  if (!why.empty()) throw Error("model config: " + why);
  const std::string bad = shape.validate(c);
  if (!bad.empty()) throw Error(bad);
  ParamLayout layout;
  add_encoder_params(layout, c);
  MaeOffsets o;
  o.encoder_total = layout.total;
  const int64_t D = c.embed_dim, Dd = shape.decoder_dim, K = c.patch_values();
  const int64_t Hm = static_cast<int64_t>(Dd * c.mlp_ratio);  // timm's Mlp: int(dim * mlp_ratio)
  const int64_t N = 1 + static_cast<int64_t>(c.grid_h()) * c.grid_w();
  o.mask_token = add_param(layout, "mask_token", {1, 1, Dd}, false);
  o.dec_embed_w = add_param(layout, "decoder_embed.weight", {Dd, D}, true);
  o.dec_embed_b = add_param(layout, "decoder_embed.bias", {Dd}, false);
  o.dec_pos = add_param(layout, "decoder_pos_embed", {1, N, Dd}, false);
  for (int i = 0; i < shape.decoder_depth; ++i)
    o.dec_blocks.push_back(add_block_params(layout, "decoder_blocks." + std::to_string(i) + ".", Dd, Hm, c.qkv_bias));
  o.dec_norm_w = add_param(layout, "decoder_norm.weight", {Dd}, false);
  o.dec_norm_b = add_param(layout, "decoder_norm.bias", {Dd}, false);
  o.dec_pred_w = add_param(layout, "decoder_pred.weight", {K, Dd}, true);
  o.dec_pred_b = add_param(layout, "decoder_pred.bias", {K}, false);
  if (off) *off = o;
  return layout;
}

// ---------------------------------------------------------------------------------------------
// MaeNet

template <class T>
MaeNet<T>::MaeNet(const VitConfig& config, const MaeShape& shape)
    : config_(config), shape_(shape), layout_(mae_param_layout(config, shape, &off_)) {
  enc_.L = config.depth;
  enc_.D = config.embed_dim;
  enc_.H = config.num_heads;
  enc_.Hm = config.mlp_hidden();
  enc_.qkv_bias = config.qkv_bias;
  enc_.eps = static_cast<T>(config.norm_eps);
  enc_.offsets = layout_.blocks;
  dec_.L = shape.decoder_depth;
  dec_.D = shape.decoder_dim;
  dec_.H = shape.decoder_heads;
  dec_.Hm = static_cast<int>(shape.decoder_dim * config.mlp_ratio);
  dec_.qkv_bias = config.qkv_bias;
  dec_.eps = static_cast<T>(config.norm_eps);
  dec_.offsets = off_.dec_blocks;
  params.assign(layout_.total, T(0));
  grads.assign(layout_.total, T(0));
}

template <class T>
T* MaeNet<T>::param(const std::string& name) {
  const ParamEntry* e = layout_.find(name);
  if (!e) throw Error("no parameter named '" + name + "'");
  return params.data() + e->offset;
}

template <class T>
T* MaeNet<T>::grad(const std::string& name) {
  const ParamEntry* e = layout_.find(name);
  if (!e) throw Error("no parameter named '" + name + "'");
  return grads.data() + e->offset;
}

template <class T>
void MaeNet<T>::zero_grad() {
  std::fill(grads.begin(), grads.end(), T(0));
}

template <class T>
void MaeNet<T>::allocate(int batch) {
  if (batch_ == batch) return;
  batch_ = batch;
  const size_t B = static_cast<size_t>(batch), Np = static_cast<size_t>(patches()), N = Np + 1;
  const size_t Ne = 1 + static_cast<size_t>(visible()), D = static_cast<size_t>(config_.embed_dim);
  const size_t Dd = static_cast<size_t>(shape_.decoder_dim), K = static_cast<size_t>(config_.patch_values());
  enc_rows_.assign(B * Ne, 0);
  hidden_.assign(B * Np, 0);
  patches_.assign(B * Np * K, 0);
  target_.assign(B * Np * K, 0);
  tokens_.assign(B * Np * D, 0);
  full_.assign(B * N * D, 0);
  enc_out_.assign(B * Ne * D, 0);
  enc_mean_.assign(B * Ne, 0);
  enc_rstd_.assign(B * Ne, 0);
  dec_tok_.assign(B * Ne * Dd, 0);
  dec_x_.assign(B * N * Dd, 0);
  dec_out_.assign(B * N * Dd, 0);
  dec_mean_.assign(B * N, 0);
  dec_rstd_.assign(B * N, 0);
  pred_.assign(B * N * K, 0);
  d_pred_.assign(B * N * K, 0);
  d_dec_out_.assign(B * N * Dd, 0);
  d_dec_x_.assign(B * N * Dd, 0);
  d_dec_tok_.assign(B * Ne * Dd, 0);
  d_enc_out_.assign(B * Ne * D, 0);
  d_full_.assign(B * N * D, 0);
  d_tokens_.assign(B * Np * D, 0);
  enc_.allocate(batch, static_cast<int>(Ne));
  dec_.allocate(batch, static_cast<int>(N));
}

template <class T>
T MaeNet<T>::forward(const T* images, const int32_t* keep, int batch) {
  if (batch < 1) throw Error("MAE forward: empty batch");
  allocate(batch);
  const VitConfig& c = config_;
  const int B = batch, D = c.embed_dim, P = c.patch_size, K = c.patch_values();
  const int Np = patches(), N = Np + 1, Nv = visible(), Ne = Nv + 1, Dd = shape_.decoder_dim;
  const T eps = static_cast<T>(c.norm_eps);
  const T* w = params.data();

  // ids_keep -> the embedded sequence's rows (0 = class token) and the loss mask (1 = hidden).
  std::fill(hidden_.begin(), hidden_.end(), uint8_t(1));
  for (int b = 0; b < B; ++b) {
    enc_rows_[static_cast<size_t>(b) * Ne] = 0;
    for (int v = 0; v < Nv; ++v) {
      const int32_t p = keep[static_cast<size_t>(b) * Nv + v];
      if (p < 0 || p >= Np || !hidden_[static_cast<size_t>(b) * Np + p])
        throw Error("MAE forward: kept patch index " + std::to_string(p) + " is out of range or repeated");
      hidden_[static_cast<size_t>(b) * Np + p] = 0;
      enc_rows_[static_cast<size_t>(b) * Ne + 1 + v] = 1 + p;
    }
  }
  // x = self.patch_embed(imgs); x = x + self.pos_embed[:, 1:, :]; cls_token + pos_embed[:, :1]
  patchify_forward(images, B, c.img_h, c.img_w, P, patches_.data());
  normalized_patch_targets(patches_.data(), B * Np, K, T(1e-6), target_.data());
  linear_forward(patches_.data(), w + layout_.patch_w, w + layout_.patch_b, B * Np, K, D, tokens_.data(), threads);
  embed_forward(tokens_.data(), w + layout_.cls_token, w + layout_.pos_embed, B, Np, D, full_.data());
  // x, mask, ids_restore = self.random_masking(x, mask_ratio); x = torch.cat((cls_tokens, x), dim=1)
  gather_rows_forward(full_.data(), enc_rows_.data(), B, N, Ne, D, enc_.input());
  // for blk in self.blocks: x = blk(x); x = self.norm(x)
  enc_.forward(w, nullptr, threads);
  layernorm_forward(enc_.output(), w + layout_.norm_w, w + layout_.norm_b, eps, B * Ne, D, enc_out_.data(),
                    enc_mean_.data(), enc_rstd_.data(), threads);
  // forward_decoder: x = self.decoder_embed(x); append mask tokens, unshuffle; x = x + self.decoder_pos_embed
  linear_forward(enc_out_.data(), w + off_.dec_embed_w, w + off_.dec_embed_b, B * Ne, D, Dd, dec_tok_.data(), threads);
  unshuffle_forward(dec_tok_.data(), enc_rows_.data(), w + off_.mask_token, B, Ne, N, Dd, dec_x_.data());
  embed_forward(dec_x_.data(), static_cast<const T*>(nullptr), w + off_.dec_pos, B, N, Dd, dec_.input());
  // for blk in self.decoder_blocks: x = blk(x); x = self.decoder_norm(x); x = self.decoder_pred(x)
  dec_.forward(w, nullptr, threads);
  layernorm_forward(dec_.output(), w + off_.dec_norm_w, w + off_.dec_norm_b, eps, B * N, Dd, dec_out_.data(),
                    dec_mean_.data(), dec_rstd_.data(), threads);
  linear_forward(dec_out_.data(), w + off_.dec_pred_w, w + off_.dec_pred_b, B * N, Dd, K, pred_.data(), threads);
  // forward_loss (norm_pix_loss=True), the class token's prediction dropped
  return masked_mse_forward(pred_.data(), target_.data(), hidden_.data(), B, 1, Np, K);
}

template <class T>
void MaeNet<T>::backward() {
  if (batch_ < 1) throw Error("MAE backward before forward");
  const VitConfig& c = config_;
  const int B = batch_, D = c.embed_dim, K = c.patch_values();
  const int Np = patches(), N = Np + 1, Ne = visible() + 1, Dd = shape_.decoder_dim;
  const T* w = params.data();
  T* g = grads.data();
  auto zero = [](std::vector<T>& v) { std::fill(v.begin(), v.end(), T(0)); };

  // loss -> decoder_pred -> decoder_norm -> decoder blocks
  zero(d_pred_);
  masked_mse_backward(pred_.data(), target_.data(), hidden_.data(), B, 1, Np, K, T(1), d_pred_.data());
  zero(d_dec_out_);
  linear_backward(d_pred_.data(), dec_out_.data(), w + off_.dec_pred_w, B * N, Dd, K, d_dec_out_.data(),
                  g + off_.dec_pred_w, g + off_.dec_pred_b, threads);
  zero(dec_.d_resid);
  layernorm_backward(d_dec_out_.data(), dec_.output(), w + off_.dec_norm_w, dec_mean_.data(), dec_rstd_.data(), B * N,
                     Dd, dec_.d_resid.data(), g + off_.dec_norm_w, g + off_.dec_norm_b, threads);
  dec_.backward(w, g, threads);
  // decoder_pos_embed, mask tokens, decoder_embed
  zero(d_dec_x_);
  embed_backward(dec_.d_resid.data(), B, N, Dd, false, d_dec_x_.data(), static_cast<T*>(nullptr), g + off_.dec_pos);
  zero(d_dec_tok_);
  unshuffle_backward(d_dec_x_.data(), enc_rows_.data(), B, Ne, N, Dd, d_dec_tok_.data(), g + off_.mask_token);
  zero(d_enc_out_);
  linear_backward(d_dec_tok_.data(), enc_out_.data(), w + off_.dec_embed_w, B * Ne, D, Dd, d_enc_out_.data(),
                  g + off_.dec_embed_w, g + off_.dec_embed_b, threads);
  // encoder: norm, blocks, then the masking gather and the embedding
  zero(enc_.d_resid);
  layernorm_backward(d_enc_out_.data(), enc_.output(), w + layout_.norm_w, enc_mean_.data(), enc_rstd_.data(), B * Ne,
                     D, enc_.d_resid.data(), g + layout_.norm_w, g + layout_.norm_b, threads);
  enc_.backward(w, g, threads);
  zero(d_full_);
  gather_rows_backward(enc_.d_resid.data(), enc_rows_.data(), B, N, Ne, D, d_full_.data());
  zero(d_tokens_);
  embed_backward(d_full_.data(), B, Np, D, true, d_tokens_.data(), g + layout_.cls_token, g + layout_.pos_embed);
  linear_backward(d_tokens_.data(), patches_.data(), w + layout_.patch_w, B * Np, K, D, static_cast<T*>(nullptr),
                  g + layout_.patch_w, g + layout_.patch_b, threads);
}

template class MaeNet<float>;
template class MaeNet<double>;

}  // namespace vitlens::train
