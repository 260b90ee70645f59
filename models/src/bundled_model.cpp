// The bundled models: the hand-designed four-head ViT and its seeded random control.
//
// Index
//   [SECTION] Design vocabulary   texture tiles and hue colours shared with demo_image.cpp
//   [SECTION] Designed model      features, patch embedding, positions, LayerNorm, heads
//   [SECTION] Random model        timm-like init from a fixed seed
//
// How the designed model works (assets/README.md has the same with measured numbers).
// timm's block computes, per token, x = patch_embed(normalised patch) + pos_embed and then
//   q, k = W_q LN1(x), W_k LN1(x);   attention = softmax(q . k / sqrt(d))
// so each head scores a pair of tokens with a bilinear form of their LayerNormed embeddings. The
// embedding carries 24 features f, each stored twice as the pair (f, -f): feature c in dim c and
// its negative in dim c + 24. Each head's W_q and W_k read only that head's own features, scaled,
// so that
//   score(i, j) = q_i . k_j / sqrt(d) = beta_h * f_h(i) . f_h(j)
// is high exactly when the two patches share the head's feature:
//   head 0  edges      f = 4 edge filters on luminance   -> same edge direction (incl. polarity)
//   head 1  texture    f = 6 texture filters on luminance -> same texture tile
//   head 2  colour     f = mean colour in the chroma plane -> similar hue
//   head 3  position   f = 12 Fourier features of (row, col) -> spatial neighbours
//
// Why the pairs: LayerNorm subtracts the mean over the D = 48 dims and divides by their std. With
// every feature stored as (f, -f) the mean is exactly 0 and the std is |f| / sqrt(24), with |f| the
// norm of the 24 features. The 12 positional features have the same norm sqrt(6) * A at every
// patch (cos^2 + sin^2 = 1), and A = 10 is large against the content features (|content| ~ 1), so
// the std is A / 2 to within 0.2 % for every patch: LN1 is then a fixed scale, not a per-patch
// renormalisation that would mix the heads. norm1.weight undoes that scale so that LN1(x) holds
// the content features in their own units and the positional features as unit cos / sin.
#include "vitlens/bundled.hpp"

#include <cmath>
#include <random>
#include <sstream>

#include "vitlens/error.hpp"

namespace vitlens {

namespace {
constexpr double kPi = 3.14159265358979323846;
}  // namespace

// [SECTION] Design vocabulary

const char* texture_name(int texture) {
  switch (texture) {
    case 0: return "vertical stripes, period 2";
    case 1: return "horizontal stripes, period 2";
    case 2: return "1-px checks";
    case 3: return "2-px checks";
    case 4: return "diagonal 1-px lines, period 4";
    case 5: return "vertical 1-px lines, period 4";
  }
  return "?";
}

float texture_pattern(int texture, int x, int y) {
  // Square wave of period 4 (2 on, 2 off) and a 1-px line every 4 px (1 on, 3 off: mean 0).
  const auto square4 = [](int t) { return ((t % 4) + 4) % 4 < 2 ? 1.0f : -1.0f; };
  const auto line4 = [](int t) { return ((t % 4) + 4) % 4 == 0 ? 0.75f : -0.25f; };
  switch (texture) {
    case 0: return (x % 2 == 0) ? 1.0f : -1.0f;
    case 1: return (y % 2 == 0) ? 1.0f : -1.0f;
    case 2: return ((x + y) % 2 == 0) ? 1.0f : -1.0f;
    case 3: return square4(x) * square4(y);
    // The phases of the two line textures are chosen so that the ten canonical patterns below are
    // linearly independent (a line on the patch's anti-diagonal, a line in its third column).
    case 4: return line4(x + y + 1);
    case 5: return line4(x + 2);
  }
  throw Error("texture_pattern: no texture " + std::to_string(texture));
}

const char* colour_name(int colour) {
  static const char* const names[kColourClasses] = {"red", "yellow", "green", "cyan", "blue", "magenta"};
  return colour >= 0 && colour < kColourClasses ? names[colour] : "?";
}

std::array<double, 3> hue_rgb(double hue_degrees, double chroma) {
  const double t = hue_degrees * (kPi / 180.0);
  std::array<double, 3> rgb{};
  for (int c = 0; c < 3; ++c)
    rgb[c] = 0.5 + chroma * (std::cos(t) * kChromaRed[c] + std::sin(t) * kChromaGreenBlue[c]);
  return rgb;
}

// [SECTION] Designed model

namespace {

constexpr int kPatch = 4;       // P
constexpr int kDim = 48;        // D
constexpr int kHeads = 4;       // H
constexpr int kHeadDim = 12;    // d
constexpr int kHalf = kDim / 2; // 24 features; feature c lives in dims c and c + 24 (negated)
constexpr int kImage = 224;
constexpr int kGrid = kImage / kPatch;  // 56 patches a side

// Feature slots (dims of the positive half).
constexpr int kEdgeFeatures = 0;       // 4: step edges at 0, 45, 90, 135 degrees
constexpr int kTextureFeatures = 4;    // 6: texture tiles 0..5
constexpr int kChromaFeatures = 10;    // 2: mean colour on kChromaRed, kChromaGreenBlue
constexpr int kPositionFeatures = 12;  // 12: (cos, sin)(w row), (cos, sin)(w col) per w

// Positional amplitude and frequencies. exp(beta3 * sum_w [cos(w dr) + cos(w dc)]) is a bump
// around the query; three octaves make it narrow (within ~1 patch at beta3 = 8) with no second
// peak on the grid: the lowest frequency has period 64 > 56 patches.
constexpr double kPosAmplitude = 10.0;  // A
constexpr double kPosOmegas[3] = {kPi / 8.0, kPi / 16.0, kPi / 32.0};

// Score scale beta_h per head: score = beta_h * f_q . f_k. Chosen so that the demo image's
// stimuli score 15 - 25 nats above a featureless patch (a key with the same feature beats
// thousands of flat keys: e^15 ~ 3e6 against N = 3137):
//   edge: white 0.95 / black 0.05 on grey 0.5 gives |f| = 0.9, 20 * 0.81 = 16 nats;
//   texture: tiles 0.5 +- 0.3 give |f| = 0.6, 60 * 0.36 = 22 nats;
//   colour: chroma 0.6 gives |f| = 1.2 (normalised units), 16 * 1.44 = 23 nats;
//   position: 8 nats per unit of the kernel; the query itself scores 48.
constexpr double kBeta[kHeads] = {20.0, 60.0, 16.0, 8.0};

// Which features each head reads, as (first slot, count).
constexpr int kHeadFirst[kHeads] = {kEdgeFeatures, kTextureFeatures, kChromaFeatures, kPositionFeatures};
constexpr int kHeadCount[kHeads] = {4, 6, 2, 12};

// The canonical luminance patterns, 4x4 row-major (y, x), in normalised units (x - 0.5) / 0.5.
// Rows 0..3: a step edge of contrast 1 through the patch centre with gradient direction 0, 45, 90,
// 135 degrees: value sign(n . (p - centre)) / 2 at pixel centre p, 0 on the edge line itself (the
// demo image draws such pixels half way). Rows 4..9: the texture tiles at a patch origin.
using Pattern = std::array<double, 16>;  // (P*P) luminance, (y, x)

std::vector<Pattern> canonical_patterns() {
  // Unit gradient directions n = (cos, sin) of 0, 45, 90, 135 degrees, written out so that pixels
  // on the edge line give an exact 0.
  const double normals[4][2] = {{1.0, 0.0}, {kInvSqrt2, kInvSqrt2}, {0.0, 1.0}, {-kInvSqrt2, kInvSqrt2}};
  std::vector<Pattern> patterns;
  for (const auto& n : normals) {
    Pattern p{};
    for (int y = 0; y < kPatch; ++y)
      for (int x = 0; x < kPatch; ++x) {
        const double along = n[0] * (x + 0.5 - 2.0) + n[1] * (y + 0.5 - 2.0);
        p[y * kPatch + x] = std::abs(along) < 1e-9 ? 0.0 : (along > 0.0 ? 0.5 : -0.5);
      }
    patterns.push_back(p);
  }
  for (int texture = 0; texture < kTextureClasses; ++texture) {
    Pattern p{};
    for (int y = 0; y < kPatch; ++y)
      for (int x = 0; x < kPatch; ++x) p[y * kPatch + x] = texture_pattern(texture, x, y);
    patterns.push_back(p);
  }
  return patterns;
}

// The dual basis of the canonical patterns B (10, 16): F = (B B^T)^-1 B, so F B^T = I. Filter k
// answers 1 to pattern k and 0 to the nine others: an edge drives no texture feature and a texture
// tile no edge feature. This needs the ten patterns to be linearly independent, which decided the
// texture set: with period-4 square stripes in both diagonal directions next to the 2-px checks,
// a mix of the edges equals a mix of those textures (rank 9).
// Gauss-Jordan with partial pivoting in double, written out so that the result is the same on
// every machine (the committed weights are compared bit for bit with regenerated ones).
std::vector<Pattern> dual_filters() {
  const std::vector<Pattern> B = canonical_patterns();
  const int n = static_cast<int>(B.size());
  // Augmented rows [G | B] with G = B B^T (n, n); reduced to [I | F].
  std::vector<std::vector<double>> a(n, std::vector<double>(n + 16, 0.0));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j)
      for (int e = 0; e < 16; ++e) a[i][j] += B[i][e] * B[j][e];
    for (int e = 0; e < 16; ++e) a[i][n + e] = B[i][e];
  }
  for (int col = 0; col < n; ++col) {
    int pivot = col;
    for (int r = col + 1; r < n; ++r)
      if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
    if (std::abs(a[pivot][col]) < 1e-9)
      throw Error("designed model: the canonical edge and texture patterns are linearly dependent");
    std::swap(a[col], a[pivot]);
    const double inv = 1.0 / a[col][col];
    for (double& v : a[col]) v *= inv;
    for (int r = 0; r < n; ++r) {
      const double f = a[r][col];
      if (r == col || f == 0.0) continue;
      for (int c = 0; c < n + 16; ++c) a[r][c] -= f * a[col][c];
    }
  }
  std::vector<Pattern> filters(n);
  for (int i = 0; i < n; ++i)
    for (int e = 0; e < 16; ++e) filters[i][e] = a[i][n + e];
  return filters;
}

TensorMap zero_tensors(const VitConfig& config) {
  TensorMap tensors;
  for (const auto& [name, shape] : expected_tensor_shapes(config)) {
    TensorData t;
    t.shape = shape;
    t.values.assign(t.numel(), 0.0f);
    tensors.emplace(name, std::move(t));
  }
  return tensors;
}

VitConfig base_config() {
  VitConfig c;
  c.patch_size = kPatch;
  c.embed_dim = kDim;
  c.num_heads = kHeads;
  c.depth = 1;
  c.img_h = c.img_w = kImage;
  c.class_token = true;
  c.mlp_ratio = 4.0;
  c.norm_eps = 1e-6f;
  c.qkv_bias = true;
  c.mean = {0.5f, 0.5f, 0.5f};
  c.std = {0.5f, 0.5f, 0.5f};
  return c;
}

}  // namespace

ModelTensors designed_model() {
  ModelTensors m;
  VitConfig& c = m.config;
  c = base_config();
  c.name = "vitlens-designed-4head";
  c.description =
      "Hand-designed, not trained: one block whose four heads are written from formulas so that each "
      "has one job (edges, texture, colour, position). Made by vitlens_make_assets; the design is "
      "explained in assets/README.md.";
  c.head_descriptions = {{
      "edges: attends from a patch to patches with a luminance edge of the same direction "
      "(orientation and polarity, 8 directions)",
      "texture: attends to patches with the same 4x4 texture tile (stripes, checks, lines)",
      "colour: attends to patches of similar hue (mean colour in the chroma plane)",
      "position: attends to spatial neighbours (a bump of about one patch around the query)",
  }};
  m.tensors = zero_tensors(c);
  const auto view = [&](const char* name, int rows, int cols) {
    std::vector<float>& v = m.tensors.at(name).values;
    if (v.size() != static_cast<size_t>(rows) * static_cast<size_t>(cols))
      throw Error(std::string("designed model: tensor ") + name + " has an unexpected size");
    return MapRM(v.data(), rows, cols);
  };

  // patch_embed.proj.weight (D, 3, P, P) seen as (D, 3*P*P): the Conv2d reads the normalised patch
  // v = (x - 0.5) / 0.5 channel-major, element (c, y, x) in column c*16 + y*4 + x.
  MapRM patch_w = view("patch_embed.proj.weight", kDim, 3 * kPatch * kPatch);
  const auto set_feature = [&](int feature, int channel, int pixel, double w) {
    patch_w(feature, channel * 16 + pixel) = static_cast<float>(w);
    patch_w(feature + kHalf, channel * 16 + pixel) = static_cast<float>(-w);
  };
  // Edge and texture features: filter k on the luminance mean(R, G, B), so weight F_k / 3 on each
  // channel. The filters sum to zero, so the -1 offset of the normalisation cancels.
  const std::vector<Pattern> filters = dual_filters();
  for (int k = 0; k < 10; ++k)
    for (int ch = 0; ch < 3; ++ch)
      for (int px = 0; px < 16; ++px) set_feature(kEdgeFeatures + k, ch, px, filters[k][px] / 3.0);
  // Chroma features: the patch's mean normalised colour projected on the two chroma axes. The
  // axes are orthogonal to grey, so the offset cancels here too and grey patches give 0.
  for (int ch = 0; ch < 3; ++ch)
    for (int px = 0; px < 16; ++px) {
      set_feature(kChromaFeatures + 0, ch, px, kChromaRed[ch] / 16.0);
      set_feature(kChromaFeatures + 1, ch, px, kChromaGreenBlue[ch] / 16.0);
    }

  // pos_embed (1, 1 + gh*gw, D): row 0 (class token) stays 0; patch (r, col) gets
  // A * [cos(w r), sin(w r), cos(w col), sin(w col)] for each w, and the negatives.
  MapRM pos = view("pos_embed", 1 + kGrid * kGrid, kDim);
  for (int r = 0; r < kGrid; ++r)
    for (int col = 0; col < kGrid; ++col)
      for (int f = 0; f < 3; ++f) {
        const double w = kPosOmegas[f];
        const double values[4] = {std::cos(w * r), std::sin(w * r), std::cos(w * col), std::sin(w * col)};
        for (int k = 0; k < 4; ++k) {
          const int dim = kPositionFeatures + 4 * f + k;
          pos(1 + r * kGrid + col, dim) = static_cast<float>(kPosAmplitude * values[k]);
          pos(1 + r * kGrid + col, dim + kHalf) = static_cast<float>(-kPosAmplitude * values[k]);
        }
      }
  // cls_token (1, 1, D) stays 0: LN1(0) = 0, so q = k = 0 for the class token. Every query gives it
  // score 0 and its own row is uniform: it has no designed role.

  // blocks.0.norm1.weight (D): LN1 divides every patch by ~A / 2 (see the top of the file). gamma
  // = A / 2 on the content dims gives back the features in their own units; gamma = 1/2 on the
  // positional dims turns A cos(.) / (A / 2) into unit cos(.). The bias stays 0.
  MapRM norm1_w = view("blocks.0.norm1.weight", 1, kDim);
  const double ln_std = kPosAmplitude * std::sqrt(6.0 / 24.0);  // sqrt(|pos|^2 / 24) = A / 2
  for (int dim = 0; dim < kDim; ++dim) {
    const bool positional = dim % kHalf >= kPositionFeatures;
    norm1_w(0, dim) = static_cast<float>(positional ? ln_std / kPosAmplitude : ln_std);
  }

  // blocks.0.attn.qkv.weight (3D, D): rows [0, 48) Q, [48, 96) K, [96, 144) V, 12 rows per head.
  // Q and K row j of head h read feature j of the head with weight sqrt(beta_h * sqrt(d)), so that
  // q . k / sqrt(d) = beta_h * f . f. V copies the same features with weight 1. The bias stays 0.
  // blocks.0.attn.proj.weight (D, D), W^O: writes value j of head h back onto its feature's dims
  // (+1 on c, -1 on c + 24), so the block adds to each feature its attention-weighted mean over the
  // keys and keeps the (f, -f) pairing. No map depends on it: depth is 1.
  MapRM qkv_w = view("blocks.0.attn.qkv.weight", 3 * kDim, kDim);
  MapRM proj_w = view("blocks.0.attn.proj.weight", kDim, kDim);
  for (int h = 0; h < kHeads; ++h) {
    const float w = static_cast<float>(std::sqrt(kBeta[h] * std::sqrt(static_cast<double>(kHeadDim))));
    for (int j = 0; j < kHeadCount[h]; ++j) {
      const int feature = kHeadFirst[h] + j;
      const int slot = h * kHeadDim + j;  // this head's j-th q / k / v column
      qkv_w(slot, feature) = w;             // Q
      qkv_w(kDim + slot, feature) = w;      // K
      qkv_w(2 * kDim + slot, feature) = 1.0f;  // V
      proj_w(feature, slot) = 1.0f;
      proj_w(feature + kHalf, slot) = -1.0f;
    }
  }
  // The MLP has no designed role: fc1, fc2 and their biases are 0, so x passes through. norm2 and
  // the final norm are identity affine (weight 1, bias 0). There is no classifier head.
  for (const char* name : {"blocks.0.norm2.weight", "norm.weight"})
    for (float& v : m.tensors.at(name).values) v = 1.0f;
  return m;
}

// [SECTION] Random model

namespace {

// Uniform in (0, 1) from one 32-bit draw. std::uniform_real_distribution and
// std::normal_distribution are implementation-defined; this is the same on every standard library.
double unit_uniform(std::mt19937& rng) { return (static_cast<double>(rng()) + 0.5) * (1.0 / 4294967296.0); }

// Approximately standard normal (Irwin-Hall: the sum of 12 uniforms minus 6), redrawn outside
// +-2 std: a truncated normal. (timm's trunc_normal_(std=.02) cuts at +-2 in absolute terms, which
// for std 0.02 cuts nothing; the control does not depend on the tails.)
double truncated_normal(std::mt19937& rng) {
  for (;;) {
    double z = -6.0;
    for (int i = 0; i < 12; ++i) z += unit_uniform(rng);
    if (z >= -2.0 && z <= 2.0) return z;
  }
}

}  // namespace

ModelTensors random_model(uint32_t seed) {
  ModelTensors m;
  VitConfig& c = m.config;
  c = base_config();
  c.name = "vitlens-random-4head";
  std::ostringstream description;
  description << "Random initialisation, untrained (timm-like: truncated normal std 0.02 for linear "
                 "layers and pos_embed, PyTorch's default uniform for the patch Conv2d, seed "
              << seed << "). The control for vitlens-designed-4head: same shape, no designed heads.";
  c.description = description.str();
  c.head_descriptions = {std::vector<std::string>(kHeads, "random init (control): no designed role")};
  TensorMap& t = m.tensors = zero_tensors(c);

  // Tensors are drawn in name order (TensorMap is sorted), so the seed fixes every value.
  std::mt19937 rng(seed);
  const double conv_bound = 1.0 / std::sqrt(3.0 * kPatch * kPatch);  // kaiming_uniform(a=sqrt 5): 1/sqrt(fan_in)
  for (auto& [name, tensor] : t) {
    // Takes the name as an argument: C++17 lambdas cannot capture a structured binding (clang 14).
    const auto ends_with = [](const std::string& key, const char* suffix) {
      const std::string s(suffix);
      return key.size() >= s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0;
    };
    std::vector<float>& v = tensor.values;
    if (name.rfind("patch_embed.proj.", 0) == 0) {
      // nn.Conv2d's own reset_parameters: weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
      for (float& x : v) x = static_cast<float>(conv_bound * (2.0 * unit_uniform(rng) - 1.0));
    } else if (name == "cls_token") {
      for (float& x : v) x = static_cast<float>(1e-6 * truncated_normal(rng));  // timm: normal_(std=1e-6)
    } else if (name.find("norm") != std::string::npos) {
      if (ends_with(name, ".weight")) std::fill(v.begin(), v.end(), 1.0f);  // LayerNorm: weight 1, bias 0
    } else if (name == "pos_embed" || ends_with(name, ".weight")) {
      for (float& x : v) x = static_cast<float>(0.02 * truncated_normal(rng));  // trunc_normal_(std=.02)
    }
    // Linear biases stay 0 (timm's init_weights_vit_timm).
  }
  return m;
}

TensorMap gaussian_tensors(const VitConfig& config, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  TensorMap tensors;
  for (const auto& [name, shape] : expected_tensor_shapes(config)) {
    TensorData t;
    t.shape = shape;
    t.values.resize(t.numel());
    const bool norm_weight = name.find("norm") != std::string::npos && name.find(".weight") != std::string::npos;
    for (float& v : t.values) v = norm_weight ? 1.0f + 0.1f * normal(rng) : scale * normal(rng);
    tensors.emplace(name, std::move(t));
  }
  return tensors;
}

}  // namespace vitlens
