#pragma once
// Forward and backward of every operation of the ViT, side by side in the manner of llm.c's
// train_gpt2.c: `op_forward` computes and caches what the backward needs, `op_backward` is next to
// it and ACCUMULATES (+=) into the gradient buffers, so a tensor used twice (the residual stream)
// simply receives two contributions. Each op is templated on the scalar: float for training,
// double for the finite-difference check (tests/test_train_grad.cpp).
//
// Dimension legend (on top of eigen.hpp's): B = images in the batch, Np = patches per image,
// N = prefix + Np tokens per image, R = B * N token rows, K = 3 P P values per patch, C = classes,
// I / O = a Linear's in / out features.
//
// Threads: every op splits its work into tasks of a FIXED size (rows, output features or
// (image, head) pairs) that do not depend on the thread count, and sums partial results in a fixed
// order, so the numbers are the same for any `threads` (0 = one per core).
#include <cstdint>
#include <functional>

#include <Eigen/Core>

namespace vitlens::train {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Runs task(i) for i in [0, tasks) on up to `threads` threads (0 = one per core). Task i's work
// must not depend on which thread runs it. The first exception is rethrown after every join.
void parallel_for(int tasks, int threads, const std::function<void(int)>& task);

// patchify: images (B, 3, H, W) -> patches (B * Np, K), each row (c, y, x) in Conv2d weight order,
// patches in raster order. With it, Conv2d(3, D, P, stride=P) is patches @ W (D, K)^T + b.
template <class T>
void patchify_forward(const T* images, int B, int H, int W, int P, T* patches);
// dimages (B, 3, H, W) += the patch gradients scattered back (pixels outside whole patches get 0).
template <class T>
void patchify_backward(const T* dpatches, int B, int H, int W, int P, T* dimages);

// linear (nn.Linear): out (R, O) = inp (R, I) @ w (O, I)^T + b (O); b may be null.
template <class T>
void linear_forward(const T* inp, const T* w, const T* b, int R, int I, int O, T* out, int threads);
// dinp (R, I) += dout @ w; dw (O, I) += dout^T @ inp; db (O) += sum over rows of dout.
// dinp and db may be null (the patch embedding's input, a Linear without bias).
template <class T>
void linear_backward(const T* dout, const T* inp, const T* w, int R, int I, int O, T* dinp, T* dw, T* db,
                     int threads);

// embed: x (B, N, D) = cat(cls_token, tokens (B, Np, D)) + pos_embed (N, D); cls null = no prefix.
template <class T>
void embed_forward(const T* tokens, const T* cls, const T* pos, int B, int Np, int D, T* x);
// dtokens (B, Np, D) += dx's patch rows; dcls (D) += sum over images of dx's first row;
// dpos (N, D) += sum over images of dx.
template <class T>
void embed_backward(const T* dx, int B, int Np, int D, bool has_cls, T* dtokens, T* dcls, T* dpos);

// layernorm (nn.LayerNorm(D, eps)): out (R, D) = (inp - mean) * rstd * w + b, biased variance;
// caches mean (R) and rstd (R).
template <class T>
void layernorm_forward(const T* inp, const T* w, const T* b, T eps, int R, int D, T* out, T* mean, T* rstd,
                       int threads);
// dinp (R, D) += dxhat * rstd - mean(dxhat) * rstd - xhat * mean(dxhat * xhat) * rstd, with
// dxhat = dout * w; dw (D) += sum dout * xhat; db (D) += sum dout.
template <class T>
void layernorm_backward(const T* dout, const T* inp, const T* w, const T* mean, const T* rstd, int R, int D,
                        T* dinp, T* dw, T* db, int threads);

// attention (timm's Attention after qkv, before proj): qkv (B, N, 3D) columns [Q | K | V], each
// head-major; probs (B, H, N, N) = softmax(Q_h K_h^T * scale) over the allowed keys; ctx (B, N, D)
// with head h in columns [h d, (h+1) d) (timm's transpose(1, 2).reshape). key_allowed (B, N),
// 1 = may be attended to, or null for every key; masked weights are exactly 0.
template <class T>
void attention_forward(const T* qkv, const uint8_t* key_allowed, int B, int N, int D, int H, T scale, T* probs,
                       T* ctx, int threads);
// dqkv (B, N, 3D) += from dctx (B, N, D), with dprobs (B, H, N, N) as scratch:
//   dP = dO V^T; dV += P^T dO; dS = P * (dP - rowsum(P * dP)); dQ += scale dS K; dK += scale dS^T Q.
template <class T>
void attention_backward(const T* dctx, const T* qkv, const T* probs, int B, int N, int D, int H, T scale,
                        T* dprobs, T* dqkv, int threads);

// gelu (nn.GELU(), exact): out = 0.5 x (1 + erf(x / sqrt 2)), n values.
template <class T>
void gelu_forward(const T* inp, int64_t n, T* out, int threads);
// dinp += dout * (Phi(x) + x phi(x)).
template <class T>
void gelu_backward(const T* dout, const T* inp, int64_t n, T* dinp, int threads);

// residual: out = a + b (n values). Backward: da += dout, db += dout (the caller passes the
// same dout buffer to both uses; when `out` overwrites `a` in place the caller keeps dout as da).
template <class T>
void residual_forward(const T* a, const T* b, int64_t n, T* out);
template <class T>
void residual_backward(const T* dout, int64_t n, T* da, T* db);

// pool: x (B, N, D) -> pooled (B, D): the class token's row when prefix = 1, else the mean over
// the N patch tokens (timm global_pool='avg' without class token; fc_norm=False, so the final
// norm stays per token as vitlens' viewer sees it).
template <class T>
void pool_forward(const T* x, int B, int N, int D, bool class_token, T* pooled);
template <class T>
void pool_backward(const T* dpooled, int B, int N, int D, bool class_token, T* dx);

// crossentropy (nn.CrossEntropyLoss(label_smoothing=eps), mean over the batch): from logits (B, C)
// and labels (B); writes probs (B, C) = softmax(logits) and returns the mean loss
//   loss_b = -(1 - eps) log p_b[y_b] - eps / C * sum_c log p_b[c].
template <class T>
T crossentropy_forward(const T* logits, const int32_t* labels, int B, int C, T smoothing, T* probs);
// dlogits (B, C) += (probs - ((1 - eps) onehot(y) + eps / C)) / B * dloss.
template <class T>
void crossentropy_backward(const T* probs, const int32_t* labels, int B, int C, T smoothing, T dloss, T* dlogits);

}  // namespace vitlens::train
