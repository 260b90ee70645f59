// Masked-autoencoder pretraining: the MAE ops, the net (encoder = VitNet's blocks on the visible
// tokens, a light decoder on all tokens), and the trainer over a photo corpus.
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

namespace vitlens {

// ---------------------------------------------------------------------------------------------
// MaeOptions, the photo split

nlohmann::json MaeOptions::to_json() const {
  nlohmann::json j = shape.to_json();
  j["crops_per_photo"] = crops_per_photo;
  j["min_crop"] = min_crop;
  j["val_crops"] = val_crops;
  j["val_seed"] = val_seed;
  j["norm_pix_loss"] = true;
  j["decoder_pos_embed"] = "learned";
  return j;
}

MaeOptions MaeOptions::from_json(const nlohmann::json& j) {
  MaeOptions o;
  o.shape = train::MaeShape::from_json(j);
  try {
    o.crops_per_photo = j.at("crops_per_photo").get<int>();
    o.min_crop = j.at("min_crop").get<double>();
    o.val_crops = j.at("val_crops").get<int>();
    o.val_seed = j.at("val_seed").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("MAE options: ") + e.what());
  }
  return o;
}

std::string MaeOptions::validate(const VitConfig& config) const {
  const std::string why = shape.validate(config);
  if (!why.empty()) return why;
  std::ostringstream out;
  if (crops_per_photo < 1 || crops_per_photo > 100000) out << "crops per photo " << crops_per_photo << " is not in [1, 100000]";
  else if (!(min_crop > 0.0 && min_crop <= 1.0)) out << "minimum crop " << min_crop << " is not in (0, 1]";
  else if (val_crops < 1 || val_crops > 100000) out << "validation crops " << val_crops << " is not in [1, 100000]";
  return out.str();
}

namespace {

void append_photo(const PhotoCorpus& from, size_t i, PhotoCorpus* to) {
  to->photos.push_back(from.photos[i]);
  to->heights.push_back(from.heights[i]);
  to->widths.push_back(from.widths[i]);
  to->names.push_back(from.names[i]);
}

}  // namespace

void split_photos(const PhotoCorpus& all, double val_fraction, uint64_t seed, PhotoCorpus* train, PhotoCorpus* val) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw Error("validation share " + std::to_string(val_fraction) + " is not in [0, 1)");
  *train = PhotoCorpus();
  *val = PhotoCorpus();
  train->source = all.source;
  val->source = all.source + " (held out)";
  const int n = all.size();
  int n_val = static_cast<int>(std::lround(val_fraction * n));
  if (val_fraction > 0.0 && n >= 2) n_val = std::max(n_val, 1);
  n_val = std::min(n_val, n - 1);
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  Rng rng(seed ^ 0x9e3779b97f4a7c15ULL);  // not the init or data stream of the same seed
  rng.shuffle(order);
  std::vector<uint8_t> is_val(static_cast<size_t>(n), 0);
  for (int i = 0; i < std::max(n_val, 0); ++i) is_val[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
  for (int i = 0; i < n; ++i) append_photo(all, static_cast<size_t>(i), is_val[static_cast<size_t>(i)] ? val : train);
}

bool is_photo_data(const std::string& data) { return data == "photos" || data.rfind("photos:", 0) == 0; }

std::string photo_data_dir(const std::string& data) { return data.size() > 7 ? data.substr(7) : default_photo_dir(); }

PhotoRunData load_photo_run_data(const std::string& data, int img_size, int limit, double val_split, uint64_t seed) {
  PhotoRunData d;
  d.dir = photo_data_dir(data);
  PhotoCorpus all = load_photo_corpus(d.dir, std::max(4 * img_size, 64), &d.report);
  if (limit > 0 && all.size() > limit) {
    const size_t n = static_cast<size_t>(limit);
    all.photos.resize(n);
    all.heights.resize(n);
    all.widths.resize(n);
    all.names.resize(n);
  }
  split_photos(all, val_split, seed, &d.train, &d.val);
  return d;
}

// ---------------------------------------------------------------------------------------------
// MaeTrainer

namespace {

// The config, once this MAE run is known to fit in memory (for the member initialisers): the
// encoder on the visible tokens, the decoder on every token, the batch whole (no parts).
const VitConfig& mae_fits_in_memory(const VitConfig& config, const Recipe& recipe, const train::MaeShape& shape) {
  TrainingMemory need;
  need.parameters = static_cast<int64_t>(train::mae_param_layout(config, shape, nullptr).total);
  const int Np = config.grid_h() * config.grid_w();
  const double B = recipe.batch, P = static_cast<double>(need.parameters), K = config.patch_values();
  const int dec_hidden = static_cast<int>(shape.decoder_dim * config.mlp_ratio);
  double floats = 4.0 * P;  // parameters, gradients, Adam's m and v
  floats += block_stack_floats(config.depth, config.embed_dim, config.num_heads, config.mlp_hidden(), shape.visible(Np) + 1, B);
  floats += block_stack_floats(shape.decoder_depth, shape.decoder_dim, shape.decoder_heads, dec_hidden, Np + 1, B);
  // Patches and targets, embeddings, the decoder's input and output, predictions and gradients.
  floats += B * (4.0 * Np * K + 3.0 * (Np + 1) * (config.embed_dim + shape.decoder_dim) + 6.0 * config.img_h * config.img_w);
  need.bytes = 4.0 * floats;
  require_training_memory(need);
  return config;
}

}  // namespace

MaeTrainer::MaeTrainer(const VitConfig& config, const Recipe& recipe, const MaeOptions& options,
                       const PhotoCorpus* train, const PhotoCorpus* val)
    : net_(mae_fits_in_memory(config, recipe, options.shape), options.shape), recipe_(recipe), options_(options), train_(train), val_(val), rng_(recipe.seed + 1) {
  std::string why = recipe.validate();
  if (why.empty()) why = options.validate(config);
  if (!why.empty()) throw Error(why);
  if (!train || train->size() < 1) throw Error("the training photo corpus is empty");
  if (steps_per_epoch() < 1)
    throw Error("the training photos give " + std::to_string(static_cast<int64_t>(train->size()) * options.crops_per_photo) +
                " crops per epoch, fewer than one batch of " + std::to_string(recipe.batch) +
                " (lower --batch or raise --crops-per-photo)");
  recipe_.shards = 1;  // each batch runs whole here; the saved recipe says so
  net_.threads = recipe.threads;
  adam_.beta1 = recipe.beta1;
  adam_.beta2 = recipe.beta2;
  adam_.eps = recipe.adam_eps;
  adam_.weight_decay = recipe.weight_decay;
  adam_.m.assign(net_.layout().total, 0.0f);
  adam_.v.assign(net_.layout().total, 0.0f);
  init_vit_params(net_.layout(), net_.params.data(), recipe.seed, config.patch_values());
  start_epoch();
}

int64_t MaeTrainer::steps_per_epoch() const {
  return static_cast<int64_t>(train_->size()) * options_.crops_per_photo / recipe_.batch;
}
int64_t MaeTrainer::total_steps() const { return steps_per_epoch() * recipe_.epochs; }

void MaeTrainer::start_epoch() {
  const int n = train_->size();
  pos_.order.resize(static_cast<size_t>(n) * static_cast<size_t>(options_.crops_per_photo));
  for (size_t i = 0; i < pos_.order.size(); ++i) pos_.order[i] = static_cast<int32_t>(i % static_cast<size_t>(n));
  rng_.shuffle(pos_.order);
  pos_.position = 0;
  std::copy(rng_.s, rng_.s + 4, pos_.rng);
}

void MaeTrainer::load_crops(const PhotoCorpus& corpus, const int32_t* photos, int count, Rng& rng, bool flip) {
  const VitConfig& c = config();
  const int S = c.img_h;
  const size_t plane = static_cast<size_t>(S) * S;
  batch_images_.resize(static_cast<size_t>(count) * 3 * plane);
  for (int i = 0; i < count; ++i) {
    float* dst = batch_images_.data() + static_cast<size_t>(i) * 3 * plane;
    crop_photo(corpus, photos[i], rng, S, static_cast<float>(options_.min_crop), flip, dst);
    for (int ch = 0; ch < 3; ++ch) {
      const float mean = c.mean[static_cast<size_t>(ch)], inv_std = 1.0f / c.std[static_cast<size_t>(ch)];
      for (size_t k = 0; k < plane; ++k) dst[ch * plane + k] = (dst[ch * plane + k] - mean) * inv_std;
    }
  }
}

StepReport MaeTrainer::step() {
  if (finished()) throw Error("training is finished: no step left");
  if (pos_.position >= steps_per_epoch()) start_epoch();
  const int B = recipe_.batch, Np = net_.patches(), Nv = net_.visible();
  // Data draws in a fixed order: every crop of the batch, then every mask.
  load_crops(*train_, pos_.order.data() + pos_.position * B, B, rng_, recipe_.flip);
  keep_.resize(static_cast<size_t>(B) * Nv);
  train::random_keep(rng_, B, Np, Nv, keep_.data());

  net_.zero_grad();
  const float loss = net_.forward(batch_images_.data(), keep_.data(), B);
  if (!std::isfinite(loss))
    throw Error("the loss is not finite at step " + std::to_string(pos_.step + 1) + ": lower --lr");
  net_.backward();
  StepReport report;
  report.grad_norm = train::clip_grad_norm(net_.grads, recipe_.clip_norm);
  const int64_t warmup = static_cast<int64_t>(std::llround(recipe_.warmup_epochs * steps_per_epoch()));
  report.lr = train::scheduled_lr(recipe_.lr, recipe_.min_lr, pos_.step, warmup, total_steps());
  adam_.update(net_.layout(), net_.params.data(), net_.grads.data(), report.lr);
  report.loss = loss;
  report.accuracy = 0.0;
  report.epoch = pos_.epoch;
  ++pos_.step;
  ++pos_.position;
  report.step = pos_.step;
  std::copy(rng_.s, rng_.s + 4, pos_.rng);
  if (pos_.position >= steps_per_epoch()) {
    ++pos_.epoch;
    if (!finished()) start_epoch();
  }
  return report;
}

EvalReport MaeTrainer::evaluate(const std::function<bool(float)>& progress) {
  EvalReport report;
  if (!has_eval()) return report;
  // Every evaluation draws the same crops and masks: a fresh generator from the fixed seed.
  Rng rng(options_.val_seed);
  const int total = val_->size() * options_.val_crops, Np = net_.patches(), Nv = net_.visible();
  std::vector<int32_t> photos;
  double loss_sum = 0.0;
  for (int start = 0; start < total; start += recipe_.batch) {
    const int count = std::min(recipe_.batch, total - start);
    photos.resize(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) photos[static_cast<size_t>(i)] = (start + i) / options_.val_crops;
    load_crops(*val_, photos.data(), count, rng, false);
    keep_.resize(static_cast<size_t>(count) * Nv);
    train::random_keep(rng, count, Np, Nv, keep_.data());
    // Every image hides the same number of patches, so the batch mean weights images equally.
    const float loss = net_.forward(batch_images_.data(), keep_.data(), count);
    loss_sum += static_cast<double>(loss) * count;
    report.images += count;
    if (progress && !progress(static_cast<float>(report.images) / static_cast<float>(total))) break;
  }
  if (report.images > 0) report.loss = loss_sum / report.images;
  return report;
}

void MaeTrainer::restore(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v,
                         int64_t adam_step, const TrainPosition& position) {
  const size_t total = net_.layout().total;
  if (params.size() != total || m.size() != total || v.size() != total)
    throw Error("saved state has " + std::to_string(params.size()) + " parameters, the model has " +
                std::to_string(total));
  const size_t expected = static_cast<size_t>(train_->size()) * static_cast<size_t>(options_.crops_per_photo);
  if (position.order.size() != expected)
    throw Error("saved state's data order covers " + std::to_string(position.order.size()) + " crops, the photos give " +
                std::to_string(expected) + " (same --data and --val-split?)");
  for (int32_t i : position.order)
    if (i < 0 || i >= train_->size()) throw Error("saved state's data order is corrupt");
  if (position.position < 0 || position.position > steps_per_epoch() || position.step < 0 || adam_step < 0)
    throw Error("saved state's position is out of range (same --batch?)");
  net_.params = params;
  adam_.m = m;
  adam_.v = v;
  adam_.step = adam_step;
  pos_ = position;
  std::copy(position.rng, position.rng + 4, rng_.s);
}

}  // namespace vitlens
