#pragma once
// A trainable ViT classifier: timm's VisionTransformer (pre-norm blocks, final norm per token,
// class-token or mean pooling, linear head) as the train_ops chained together, llm.c style:
// parameters, gradients and the Adam moments each in ONE allocation addressed by a table of
// offsets carrying timm's tensor names and shapes (those of models/model_io.hpp plus
// head.weight/bias), activations allocated once per batch size. Templated on the scalar: float
// trains, double checks gradients by finite differences.
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/vit.hpp"

namespace vitlens::train {

struct ParamEntry {
  std::string name;            // timm name, e.g. "blocks.0.attn.qkv.weight"
  std::vector<int64_t> shape;  // timm shape, e.g. (3D, D)
  size_t offset = 0;           // into the one parameter buffer
  size_t size = 0;             // product(shape)
  bool decay = false;          // AdamW weight decay applies (timm's default: weights of >= 2 dims
                               // except pos_embed and cls_token; no biases, norms, tokens)
};

// Offsets of one block's tensors in the parameter buffer (qkv_b = SIZE_MAX without qkv bias).
struct BlockOffsets {
  size_t norm1_w, norm1_b, qkv_w, qkv_b, proj_w, proj_b, norm2_w, norm2_b, fc1_w, fc1_b, fc2_w, fc2_b;
};

struct ParamLayout {
  std::vector<ParamEntry> entries;  // in timm's state_dict order
  size_t total = 0;
  size_t patch_w = 0, patch_b = 0, cls_token = 0, pos_embed = 0, norm_w = 0, norm_b = 0, head_w = 0, head_b = 0;
  std::vector<BlockOffsets> blocks;
  const ParamEntry* find(const std::string& name) const;
};

// The table for a config and class count. Throws vitlens::Error on an inconsistent config or
// num_classes < 2.
ParamLayout param_layout(const VitConfig& config, int num_classes);

// Appends one tensor to a layout (its offset is the layout's total so far) and returns the offset.
size_t add_param(ParamLayout& layout, const std::string& name, std::vector<int64_t> shape, bool decay);
// Appends one timm Block's tensors under `prefix` ("blocks.3." or MAE's "decoder_blocks.0.").
BlockOffsets add_block_params(ParamLayout& layout, const std::string& prefix, int64_t D, int64_t Hm, bool qkv_bias);
// Appends the encoder of timm's VisionTransformer without its head: cls_token, pos_embed,
// patch_embed, blocks, norm (state_dict order); sets the layout's encoder offsets.
void add_encoder_params(ParamLayout& layout, const VitConfig& config);
// Empty when the training ops compute every option of `config` (timm's plain pre-norm block, exact
// GELU, a position table, class token or not), else a one-line reason naming the first option they
// do not (rotary embeddings, SwiGLU, LayerScale, registers, ...). add_encoder_params refuses those.
std::string untrainable_option(const VitConfig& config);

// The pre-norm transformer blocks (timm's Block: x = x + attn(norm1(x)); x = x + mlp(norm2(x))) on
// any token count: the classifier's encoder, MAE's encoder on the visible tokens and MAE's decoder
// all run through it. The caller writes the input rows into resid (layer 0) and reads the output
// from layer L; backward takes d loss / d output in d_resid and leaves d loss / d input there.
template <class T>
struct BlockStack {
  // Shape and where the weights are (filled by the owner before allocate).
  int L = 0, D = 0, H = 0, Hm = 0;  // blocks, width, heads, MLP hidden
  bool qkv_bias = true;
  T eps = T(1e-6);
  std::vector<BlockOffsets> offsets;  // (L) into the owner's parameter buffer
  // Stochastic depth (timm's DropPath), or null: (L, 2, B) per-image scales of block l's attention
  // (2l) and MLP (2l + 1) branch for the next forward and its backward (drop_path_forward).
  const T* drop_scale = nullptr;

  int batch = 0, tokens = 0;   // B, N of the allocated buffers
  std::vector<T> resid;        // (L+1, B*N, D) residual stream entering each block, then the last
  std::vector<T> ln1, ln1_mean, ln1_rstd;  // (L, B*N, D), (L, B*N), (L, B*N)
  std::vector<T> qkv;          // (L, B*N, 3D)
  std::vector<T> probs;        // (L, B, H, N, N) attention weights
  std::vector<T> ctx;          // (L, B*N, D) attention output before proj
  std::vector<T> mid;          // (L, B*N, D) residual after attention
  std::vector<T> ln2, ln2_mean, ln2_rstd;  // (L, B*N, D), (L, B*N), (L, B*N)
  std::vector<T> gelu_slope;   // (L, B*N, Hm) GELU'(fc1 output): all the backward needs of it
  std::vector<T> gelu;         // (L, B*N, Hm)
  // Backward scratch, one layer's shapes; d_resid (B*N, D) is the stack's gradient in and out.
  std::vector<T> d_resid, d_ln, d_qkv, d_ctx, d_hidden;
  std::vector<T> d_branch;     // (B*N, D) a dropped-path branch's output gradient; empty without drop_scale
  // (B*N, D) a dropped-path branch's output (proj or fc2) before drop_path_forward, one layer at a
  // time; empty without drop_scale (otherwise the products add the residual in their epilogue).
  std::vector<T> branch_out;

  void allocate(int B, int N);                 // no-op when (B, N) is unchanged
  T* input() { return resid.data(); }          // (B*N, D) rows of layer 0
  const T* output() const { return resid.data() + static_cast<size_t>(L) * batch * tokens * D; }  // (B*N, D)
  // key_allowed (B, N) or null: vitlens' padding mask (train_ops.hpp, attention_forward).
  void forward(const T* w, const uint8_t* key_allowed, int threads);
  // grads g += d loss / d weights; d_resid: d loss / d output in, d loss / d input out.
  void backward(const T* w, T* g, int threads);
};

template <class T>
struct Activations {
  int batch = 0;
  std::vector<T> patches;      // (B*Np, K) patchified input
  std::vector<T> tokens;       // (B*Np, D) patch embeddings
  std::vector<T> out, out_mean, out_rstd;  // (B*N, D) after the final norm, (B*N), (B*N)
  std::vector<T> pooled;       // (B, D)
  std::vector<T> logits;       // (B, C)
  std::vector<T> probs_out;    // (B, C) softmax of the logits
  std::vector<T> d_tokens, d_patches, d_out, d_pooled, d_logits;  // backward scratch, shapes as above
};

template <class T>
class VitNet {
 public:
  VitNet(const VitConfig& config, int num_classes);

  const VitConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  int num_classes() const { return num_classes_; }
  int tokens() const { return config_.prefix_tokens() + config_.grid_h() * config_.grid_w(); }  // N
  int threads = 0;            // 0 = one per core
  T label_smoothing = 0;      // as nn.CrossEntropyLoss(label_smoothing=...)
  // Stochastic depth for the next forward and its backward: (L, 2, B) scales, block
  // l's attention branch at [2l B, 2l B + B), its MLP branch after it (BlockStack::drop_scale); each
  // is 0 (dropped) or 1 / (1 - p) (kept). Empty = no drop path (evaluation).
  std::vector<T> drop_scale;

  std::vector<T> params;  // (layout().total)
  std::vector<T> grads;   // (layout().total)

  T* param(const std::string& name);  // throws vitlens::Error on an unknown name
  T* grad(const std::string& name);

  // images (B, 3, H, W) at the config's img size, already normalised by mean/std;
  // key_allowed (B, N) or null (vitlens' padding mask: 0 = never attended to);
  // labels (B) or null (then no loss: returns 0). Caches everything backward needs.
  T forward(const T* images, const int32_t* labels, const uint8_t* key_allowed, int batch);
  // grads += d loss / d params for the last forward (which must have had labels); also
  // d loss / d images into input_grad() when want_input_grad.
  void backward(bool want_input_grad = false);
  void zero_grad();

  const T* logits() const { return acts_.logits.data(); }  // (B, C) of the last forward
  const std::vector<T>& input_grad() const { return d_images_; }  // (B, 3, H, W)
  const Activations<T>& activations() const { return acts_; }
  const BlockStack<T>& blocks() const { return blocks_; }

 private:
  void allocate(int batch);

  VitConfig config_;
  int num_classes_;
  ParamLayout layout_;
  Activations<T> acts_;
  BlockStack<T> blocks_;
  std::vector<T> images_;  // (B, 3, H, W) copy of the last input (for the input gradient)
  std::vector<int32_t> labels_;
  std::vector<uint8_t> key_allowed_;
  std::vector<T> drop_used_;  // the last forward's drop_scale
  std::vector<T> d_images_;
};

extern template struct BlockStack<float>;
extern template struct BlockStack<double>;
extern template class VitNet<float>;
extern template class VitNet<double>;

}  // namespace vitlens::train
