#pragma once
// Masked-autoencoder pretraining (He et al. 2021, "Masked Autoencoders Are Scalable Vision
// Learners", facebookresearch/mae's models_mae.py) on the trainable ViT of vit_train.hpp:
//
//   patches -> patch_embed + pos_embed -> keep a random Nv of the Np patch tokens per image (MAE's
//   argsort of noise) -> cat(cls_token + pos_embed[0], visible) -> encoder blocks -> norm
//   -> decoder_embed (D -> Dd) -> put the visible tokens back in place, mask_token everywhere else
//   -> + decoder_pos_embed -> decoder blocks (width Dd) -> decoder_norm -> decoder_pred (Dd -> K)
//   -> mean squared error against each HIDDEN patch's pixels normalised by the patch's own mean and
//   variance (norm_pix_loss), over hidden patches only.
//
// The encoder is timm's VisionTransformer with the same tensor names as the classifier (VitNet),
// so its weights open in `vitlens view` unchanged. Differences from models_mae.py, on purpose:
// decoder_pos_embed is LEARNED (trunc-normal std 0.02 like pos_embed) instead of fixed 2-D sin-cos,
// the encoder's pos_embed is learned too (as timm's classifier), Linear weights start N(0, 0.02)
// (timm) instead of Xavier, and a patch's K = 3 P P values are in Conv2d weight order (c, y, x)
// instead of MAE's patchify order (y, x, c) -- the loss does not depend on the order.
//
// Legend (on top of train_ops.hpp's): Np = patches per image, Nv = visible patches per image,
// Ne = 1 + Nv encoder tokens, N = 1 + Np decoder tokens, Dd = decoder width.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/data/dataset.hpp"
#include "core/train/vit_train.hpp"

namespace vitlens::train {

// ---------------------------------------------------------------------------------------------
// The MAE ops, forward and backward side by side (backward ACCUMULATES, as train_ops.hpp).

// gather_rows: out (B, M, D) = inp (B, N, D) at rows idx (B, M) of each image (torch.gather along
// dim 1, MAE's x_masked = torch.gather(x, 1, ids_keep...)).
template <class T>
void gather_rows_forward(const T* inp, const int32_t* idx, int B, int N, int M, int D, T* out);
// dinp (B, N, D) += dout (B, M, D) scattered back to rows idx.
template <class T>
void gather_rows_backward(const T* dout, const int32_t* idx, int B, int N, int M, int D, T* dinp);

// unshuffle: out (B, N, D): row idx[b, m] = inp[b, m] for each m < M, every other row = mask_token
// (D) -- MAE's cat([x, mask_tokens]) then gather with ids_restore. idx rows must be distinct per image.
template <class T>
void unshuffle_forward(const T* inp, const int32_t* idx, const T* mask_token, int B, int M, int N, int D, T* out);
// dinp (B, M, D) += dout's rows idx; dmask_token (D) += the sum of dout over the other rows.
template <class T>
void unshuffle_backward(const T* dout, const int32_t* idx, int B, int M, int N, int D, T* dinp, T* dmask_token);

// norm_pix targets (no gradient: the target is data): target (R, K) = (x - mean) / sqrt(var + eps)
// per row, var UNBIASED as torch's Tensor.var (MAE: target.var(dim=-1, keepdim=True)), eps 1e-6.
template <class T>
void normalized_patch_targets(const T* patches, int R, int K, T eps, T* target);

// masked_mse: pred (B, prefix + Np, K) (prefix rows ignored: MAE drops the class token's
// prediction), target (B, Np, K), hidden (B, Np) 1 = hidden. Returns
//   loss = sum over hidden patches of mean_k (pred - target)^2 / (number of hidden patches).
template <class T>
T masked_mse_forward(const T* pred, const T* target, const uint8_t* hidden, int B, int prefix, int Np, int K);
// dpred += 2 (pred - target) / (K * hidden count) * dloss on hidden rows; 0 elsewhere.
template <class T>
void masked_mse_backward(const T* pred, const T* target, const uint8_t* hidden, int B, int prefix, int Np, int K,
                         T dloss, T* dpred);

// MAE's random_masking: per image, Np uniform draws (noise), a stable ascending argsort, the first
// Nv indices are kept, in that (shuffled) order. keep (B, Nv). Draws B * Np uniforms from rng.
void random_keep(Rng& rng, int B, int Np, int Nv, int32_t* keep);

// ---------------------------------------------------------------------------------------------
// The net

struct MaeShape {
  int decoder_dim = 32;       // Dd
  int decoder_depth = 1;      // decoder blocks
  int decoder_heads = 4;      // Dd must divide by it
  double mask_ratio = 0.75;   // share of patches hidden
  // Nv = int(Np (1 - mask_ratio)) as models_mae.py's len_keep.
  int visible(int Np) const;
  // "" when usable with `config`, else one reason.
  std::string validate(const VitConfig& config) const;
  nlohmann::json to_json() const;
  static MaeShape from_json(const nlohmann::json& j);  // throws vitlens::Error
};

// Offsets of the decoder's tensors (the encoder's are in ParamLayout's own fields and blocks).
struct MaeOffsets {
  size_t mask_token = 0, dec_embed_w = 0, dec_embed_b = 0, dec_pos = 0, dec_norm_w = 0, dec_norm_b = 0,
         dec_pred_w = 0, dec_pred_b = 0;
  std::vector<BlockOffsets> dec_blocks;
  size_t encoder_total = 0;  // the encoder's entries come first: [0, encoder_total)
};

// The encoder's entries (timm names, no head), then mask_token (1, 1, Dd), decoder_embed (Dd, D),
// decoder_pos_embed (1, N, Dd), decoder_blocks.i.*, decoder_norm, decoder_pred (K, Dd).
// Throws vitlens::Error on a shape MaeShape::validate refuses.
ParamLayout mae_param_layout(const VitConfig& config, const MaeShape& shape, MaeOffsets* offsets);
bool is_decoder_param(const std::string& name);  // mask_token, decoder_*

template <class T>
class MaeNet {
 public:
  MaeNet(const VitConfig& config, const MaeShape& shape);

  const VitConfig& config() const { return config_; }
  const MaeShape& shape() const { return shape_; }
  const ParamLayout& layout() const { return layout_; }
  const MaeOffsets& offsets() const { return off_; }
  int patches() const { return config_.grid_h() * config_.grid_w(); }  // Np
  int visible() const { return shape_.visible(patches()); }             // Nv
  int threads = 0;

  std::vector<T> params;  // (layout().total)
  std::vector<T> grads;   // (layout().total)
  T* param(const std::string& name);  // throws vitlens::Error on an unknown name
  T* grad(const std::string& name);
  void zero_grad();

  // images (B, 3, H, W) normalised by mean/std; keep (B, Nv) the patch indices in [0, Np) the
  // encoder sees (distinct per image, any order). Returns the loss; caches what backward needs.
  T forward(const T* images, const int32_t* keep, int batch);
  // grads += d loss / d params of the last forward.
  void backward();

  const T* prediction() const { return pred_.data(); }   // (B, N, K) of the last forward
  const T* targets() const { return target_.data(); }    // (B, Np, K)
  const BlockStack<T>& encoder() const { return enc_; }  // on Ne tokens

 private:
  void allocate(int batch);

  VitConfig config_;
  MaeShape shape_;
  MaeOffsets off_;
  ParamLayout layout_;
  BlockStack<T> enc_, dec_;
  int batch_ = 0;
  std::vector<int32_t> enc_rows_;  // (B, Ne) rows of the embedded (B, N, D) sequence: 0 (class), 1 + keep
  std::vector<uint8_t> hidden_;    // (B, Np) 1 = hidden
  std::vector<T> patches_;         // (B*Np, K)
  std::vector<T> target_;          // (B*Np, K) norm_pix targets
  std::vector<T> tokens_;          // (B*Np, D) patch embeddings
  std::vector<T> full_;            // (B, N, D) cls + tokens + pos_embed, before masking
  std::vector<T> enc_out_, enc_mean_, enc_rstd_;  // (B*Ne, D), (B*Ne), (B*Ne) after norm
  std::vector<T> dec_tok_;         // (B*Ne, Dd) decoder_embed output
  std::vector<T> dec_x_;           // (B, N, Dd) with mask tokens, before decoder_pos_embed
  std::vector<T> dec_out_, dec_mean_, dec_rstd_;  // (B*N, Dd), (B*N), (B*N) after decoder_norm
  std::vector<T> pred_;            // (B*N, K)
  std::vector<T> d_pred_, d_dec_out_, d_dec_x_, d_dec_tok_, d_enc_out_, d_full_, d_tokens_;  // shapes as above
};

extern template class MaeNet<float>;
extern template class MaeNet<double>;

}  // namespace vitlens::train
