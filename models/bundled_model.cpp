// The bundled models: the hand-designed four-head ViT and its seeded random control.
//
// Index
//   [SECTION] Design vocabulary   texture tiles and hue colours shared with demo_image.cpp
//   [SECTION] Designed model      features, patch embedding, positions, LayerNorm, heads
//   [SECTION] Random model        timm-like init from a fixed seed
//
// How the designed model works (assets/README.md has the same with measured numbers).
// timm's block computes, per token, x = patch_embed(normalised patch) + pos_embed and then
//   q, k = W_q LN1(x) + b_q, W_k LN1(x);   attention = softmax(q . k / sqrt(d))
// so before attention the only non-linear step is LayerNorm, and the design uses it on purpose.
// Each token carries 23 features f, embedded as x = E f with E (48, 23) orthonormal columns
// orthogonal to (1, ..., 1): x has mean 0 over the dims and |x| = |f|, so LN1(x) = sqrt(D) E f / |f|
// (weight 1, bias 0): every head sees its features divided by the token's whole norm |f|.
//   f = [ b (constant) | 4 positional A cos/sin | K * 15 zero-mean luminance coefficients (2 ramps
//         + 13 others, an orthonormal basis) | eps * mean R, G, B ]
// |f|^2 = F^2 + K^2 |AC|^2 (+ a little colour), with F^2 = b^2 + 2 A^2 = 1 and |AC|^2 the patch's
// luminance contrast energy, which does not depend on where a pattern sits in the patch. So
// s = F / |f| is 1 on a flat patch and falls with contrast, and rho = K ramp / |f| is the patch's
// luminance gradient normalised by its contrast: both survive lighting changes, noise and shifts,
// unlike exact 4x4 filters. The heads' scores (W_q, W_k and b_q written from these formulas):
//   head 0  edges      beta_e rho_i . rho_j                 -> gradient in the same direction
//   head 1  texture    beta_t (s_i - s0) s_j                 -> textured to textured, smooth to smooth
//   head 2  colour     beta_c (m_i . m_j) s_i s_j               -> similar mean colour m
//   head 3  position   beta_p [cos(w dr) + cos(w dc) - c] s_i s_j  -> spatial neighbours
// A depth-1 head cannot do better with a bilinear score: a texture type (rather than amount) or an
// orientation without polarity would need a product of a patch's pixels with themselves, which
// only LayerNorm's 1 / |f| provides.
#include "models/bundled.hpp"

#include <cmath>
#include <random>
#include <sstream>

#include "core/base/error.hpp"

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
constexpr int kImage = 224;
constexpr int kGrid = kImage / kPatch;  // 56 patches a side

// The 23 features f of a token (see the top of the file), in this order:
constexpr int kConstFeature = 0;      // 1: b, the same for every patch
constexpr int kPositionFeatures = 1;  // 4: A (cos, sin)(w row), A (cos, sin)(w col)
constexpr int kRampFeatures = 5;      // 2: K * luminance ramp coefficients (x, y)
[[maybe_unused]] constexpr int kDetailFeatures = 7;  // 13: K * the other zero-mean luminance coefficients (the layout; unread)
constexpr int kColourFeatures = 20;   // 3: eps * mean normalised R, G, B
constexpr int kFeatures = 23;

// The floor F = |(b, A cos, A sin, ...)| = 1: b^2 + 2 A^2 = 1 with b = A = 1/sqrt 3. Every patch
// token has |f| >= F, and s = F / |f| is 1 on a flat patch and falls towards 0 with contrast.
constexpr double kConst = 0.57735026918962576451;        // b = 1/sqrt 3
constexpr double kPosAmplitude = 0.57735026918962576451;  // A = 1/sqrt 3
// One frequency per axis, low enough that cos(w d) falls over the whole grid (56 w < pi): the
// score has no second peak. (Three frequencies pi/8, pi/16, pi/32 came back to 4 of their 6 at 32
// patches, and every key of the query's row and column kept half the peak: on textured photos,
// where s shrinks every score, most of the mass went there.)
constexpr double kPosOmega = kPi / 64.0;
// Contrast gain K: a patch whose luminance std is kHalfContrast (in [0, 1] pixel units) has
// s = 1/2, i.e. K * |AC| = sqrt 3 with |AC| = 4 * 2 * std in normalised units.
constexpr double kHalfContrast = 0.03;
constexpr double kContrastGain = 1.7320508075688772935 / (8.0 * kHalfContrast);  // K
constexpr double kColourGain = 0.05;  // eps: small, so colour barely changes |f|

// Per head, the score it computes (s = F / |f|, rho = K * ramp / |f|, m = mean normalised colour,
// P = sum_w [cos(w dr) + cos(w dc)]):
//   edge      beta_e rho_i . rho_j
//   texture   beta_t (s_i - s0) s_j
//   colour    beta_c (m_i . m_j) s_i s_j
//   position  beta_p P_ij s_i s_j
constexpr double kBetaEdge = 20.0;
constexpr double kBetaTexture = 30.0;
constexpr double kSmoothSwitch = 0.5;  // s0
constexpr double kBetaColour = 8.0;
// Position: beta_p [cos(w dr) + cos(w dc) - c] s_i s_j is 0 at kPositionRadius patches from the
// query along a row or column (c = 1 + cos(w R)) and negative beyond it, so a far key scores below
// a near one whatever either's contrast (a positive far score would favour flat far keys over
// textured near ones, since s_j scales it). Near the query the bracket is about
// (w^2 / 2)(R^2 - dr^2 - dc^2): a bump. beta_p is set by kPositionSharpness, the nats between a
// flat query's own patch and a direct neighbour (beta_p w^2 / 2); s_i s_j scales it down on
// textured patches (s^2 = 0.03 at a luminance std of 0.1), which the large value leaves local.
constexpr double kPositionRadius = 3.5;
constexpr double kPositionSharpness = 8.0;

// An orthonormal basis of the 4x4 luminance patch, rows (16, 16) over pixels (y, x): row 0 the
// mean (1/4 everywhere), rows 1-2 the ramps (x - 1.5) / sqrt 20 and (y - 1.5) / sqrt 20, rows
// 3-15 the rest of the zero-mean space: Gram-Schmidt, in double, of the 2-D DCT-II basis
// cos(pi (x + 1/2) u / 4) cos(pi (y + 1/2) v / 4) against what came before (v outer, u inner;
// candidates that reduce to 0 are skipped). Written out so the weights are the same everywhere.
std::vector<std::array<double, 16>> luminance_basis() {
  std::vector<std::array<double, 16>> candidates;
  std::array<double, 16> b{};
  for (int e = 0; e < 16; ++e) b[e] = 0.25;
  candidates.push_back(b);
  for (int axis = 0; axis < 2; ++axis) {
    for (int e = 0; e < 16; ++e) b[e] = ((axis == 0 ? e % 4 : e / 4) - 1.5) / std::sqrt(20.0);
    candidates.push_back(b);
  }
  for (int v = 0; v < 4; ++v)
    for (int u = 0; u < 4; ++u) {
      for (int e = 0; e < 16; ++e)
        b[e] = std::cos(kPi * (e % 4 + 0.5) * u / 4.0) * std::cos(kPi * (e / 4 + 0.5) * v / 4.0);
      candidates.push_back(b);
    }
  std::vector<std::array<double, 16>> basis;
  for (std::array<double, 16> c : candidates) {
    for (const auto& u : basis) {
      double dot = 0.0;
      for (int e = 0; e < 16; ++e) dot += u[e] * c[e];
      for (int e = 0; e < 16; ++e) c[e] -= dot * u[e];
    }
    double norm = 0.0;
    for (const double x : c) norm += x * x;
    norm = std::sqrt(norm);
    if (norm < 1e-6) continue;
    for (double& x : c) x /= norm;
    basis.push_back(c);
  }
  if (basis.size() != 16) throw Error("designed model: the luminance basis has " + std::to_string(basis.size()) + " rows, not 16");
  return basis;
}

// E (D, features): column k is the DCT-II vector sqrt(2/D) cos(pi (n + 1/2)(k + 1) / D) over dims
// n. The columns are orthonormal and orthogonal to (1, ..., 1), so x = E f has mean 0 over the
// dims and |x| = |f|: LayerNorm sees exactly |f|.
double embedding(int dim, int feature) {
  return std::sqrt(2.0 / kDim) * std::cos(kPi * (dim + 0.5) * (feature + 1) / kDim);
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

VitConfig designed_config() {
  VitConfig c = base_config();
  c.name = "vitlens-designed-4head";
  c.description =
      "Hand-designed, not trained: one block whose four heads are written from formulas so that each "
      "has one job (edges, texture, colour, position), contrast-normalised by LayerNorm so that they "
      "work on photographs. Made by vitlens_make_assets; the design is explained in assets/README.md.";
  c.head_descriptions = {{
      "edges: attends from a patch to patches whose luminance gradient points the same way "
      "(contrast-normalised, cosine-tuned, with polarity)",
      "texture: textured patches attend to textured patches, smooth ones to smooth ones "
      "(the patch's contrast energy through LayerNorm)",
      "colour: attends to patches of a similar mean colour (its direction from mid grey), flat ones "
      "more than textured ones",
      "position: attends to the query's own patch and its spatial neighbours within about 3 patches "
      "(sharpest on flat patches), on any image",
  }};
  return c;
}

// The designed model's tensor NAME seen as a (ROWS, COLS) row-major matrix.
MapRM tensor_view(ModelTensors& m, const char* name, int rows, int cols) {
  std::vector<float>& v = m.tensors.at(name).values;
  if (v.size() != static_cast<size_t>(rows) * static_cast<size_t>(cols))
    throw Error(std::string("designed model: tensor ") + name + " has an unexpected size");
  return MapRM(v.data(), rows, cols);
}

// The feature filters over a patch's 48 normalised inputs v = (x - 0.5) / 0.5, channel-major
// (element (c, y, x) in column c*16 + y*4 + x), one row per feature.
std::vector<std::array<double, 48>> patch_filters() {
  std::vector<std::array<double, 48>> filters(kFeatures, std::array<double, 48>{});
  const std::vector<std::array<double, 16>> basis = luminance_basis();
  // Ramp and detail features: K times the coefficient of the luminance mean(R, G, B) on basis rows
  // 1..15, so weight K * B / 3 on each channel. These rows sum to 0: the -1 offset of v cancels.
  for (int row = 1; row < 16; ++row)
    for (int ch = 0; ch < 3; ++ch)
      for (int px = 0; px < 16; ++px)
        filters[static_cast<size_t>(kRampFeatures + row - 1)][static_cast<size_t>(ch * 16 + px)] =
            kContrastGain * basis[static_cast<size_t>(row)][static_cast<size_t>(px)] / 3.0;
  // Colour features: eps times the channel's mean of v (0 for mid grey).
  for (int ch = 0; ch < 3; ++ch)
    for (int px = 0; px < 16; ++px)
      filters[static_cast<size_t>(kColourFeatures + ch)][static_cast<size_t>(ch * 16 + px)] = kColourGain / 16.0;
  return filters;
}

// patch_embed.proj.weight (D, 3, P, P) seen as (D, 3*P*P): the Conv2d reads the normalised patch
// through the feature filters embedded: W = E * filters; its bias carries the constant feature.
void set_patch_embedding(ModelTensors& m) {
  const std::vector<std::array<double, 48>> filters = patch_filters();
  MapRM patch_w = tensor_view(m, "patch_embed.proj.weight", kDim, 3 * kPatch * kPatch);
  MapRM patch_b = tensor_view(m, "patch_embed.proj.bias", 1, kDim);
  for (int dim = 0; dim < kDim; ++dim) {
    for (int in = 0; in < 48; ++in) {
      double w = 0.0;
      for (int f = 0; f < kFeatures; ++f) w += embedding(dim, f) * filters[static_cast<size_t>(f)][static_cast<size_t>(in)];
      patch_w(dim, in) = static_cast<float>(w);
    }
    patch_b(0, dim) = static_cast<float>(embedding(dim, kConstFeature) * kConst);
  }
}

// pos_embed (1, 1 + gh*gw, D): row 0 (class token) stays 0; patch (r, col) gets E times
// A * [cos(w r), sin(w r), cos(w col), sin(w col)].
void set_position_embedding(ModelTensors& m) {
  MapRM pos = tensor_view(m, "pos_embed", 1 + kGrid * kGrid, kDim);
  for (int r = 0; r < kGrid; ++r)
    for (int col = 0; col < kGrid; ++col)
      for (int dim = 0; dim < kDim; ++dim) {
        const double w = kPosOmega;
        const double values[4] = {std::cos(w * r), std::sin(w * r), std::cos(w * col), std::sin(w * col)};
        double x = 0.0;
        for (int j = 0; j < 4; ++j) x += embedding(dim, kPositionFeatures + j) * kPosAmplitude * values[j];
        pos(1 + r * kGrid + col, dim) = static_cast<float>(x);
      }
  // cls_token (1, 1, D) stays 0 and so does its pos_embed row: LN1(0) = 0, so k = 0 for the class
  // token (every query gives it score 0); its own q is the bias alone. It has no designed role.
}

// blocks.0.attn.qkv.weight (3D, D): rows [0, 48) Q, [48, 96) K, [96, 144) V, 12 rows per head.
// A head's slot reads one feature with weight w: row = w * E^T row, so q_slot = w sqrt(D) f / |f|
// and score = q . k / sqrt(d). V copies the same feature with weight 1; blocks.0.attn.proj.weight
// (D, D), W^O, writes the value slot back along the feature's column of E, so the block adds to
// each feature its attention-weighted mean. No map depends on V or W^O: depth is 1.
struct AttentionWeights {
  MapRM qkv_w, proj_w;

  // Slot SLOT of head HEAD reads FEATURE with weight W_QK in K and Q_SIGN * W_QK in Q.
  void read(int head, int slot, int feature, double w_qk, double q_sign = 1.0) {
    const int row = head * kHeadDim + slot;
    for (int dim = 0; dim < kDim; ++dim) {
      const double e = embedding(dim, feature);
      qkv_w(row, dim) = static_cast<float>(q_sign * w_qk * e);    // Q
      qkv_w(kDim + row, dim) = static_cast<float>(w_qk * e);      // K
      qkv_w(2 * kDim + row, dim) = static_cast<float>(e);         // V
      proj_w(dim, row) = static_cast<float>(e);                   // W^O
    }
  }
};

// The four heads' slots. The weights give the scores at the top of this section (F = 1, so s = 1 / |f|):
//   edge      slots 0-1 read the ramps, w^2 D / sqrt(d) = beta_e
//   texture   slot 0 reads b, w^2 D b^2 / sqrt(d) = beta_t; q bias -w sqrt(D) b s0
//   colour    slots 0-2 read the colour, w^2 D eps^2 / sqrt(d) = beta_c
//   position  slots 0-3 read the positional features, w^2 D A^2 / sqrt(d) = beta_p; slot 4 reads
//             b with -w' in Q and +w' in K, w'^2 D b^2 / sqrt(d) = c beta_p: the bracket's -c
// K has no bias.
void set_attention(ModelTensors& m) {
  AttentionWeights heads{tensor_view(m, "blocks.0.attn.qkv.weight", 3 * kDim, kDim),
                         tensor_view(m, "blocks.0.attn.proj.weight", kDim, kDim)};
  MapRM qkv_b = tensor_view(m, "blocks.0.attn.qkv.bias", 1, 3 * kDim);
  const double sqrt_d = std::sqrt(static_cast<double>(kHeadDim)), sqrt_dim = std::sqrt(static_cast<double>(kDim));
  const double w_edge = std::sqrt(kBetaEdge * sqrt_d / kDim);
  for (int j = 0; j < 2; ++j) heads.read(kEdgeHead, j, kRampFeatures + j, w_edge);
  const double w_texture = std::sqrt(kBetaTexture * sqrt_d / kDim) / kConst;
  heads.read(kTextureHead, 0, kConstFeature, w_texture);
  qkv_b(0, kTextureHead * kHeadDim) = static_cast<float>(-w_texture * sqrt_dim * kConst * kSmoothSwitch);
  const double w_colour = std::sqrt(kBetaColour * sqrt_d / kDim) / kColourGain;
  for (int j = 0; j < 3; ++j) heads.read(kColourHead, j, kColourFeatures + j, w_colour);
  const double beta_position = 2.0 * kPositionSharpness / (kPosOmega * kPosOmega);
  const double offset = 1.0 + std::cos(kPosOmega * kPositionRadius);  // c
  const double w_position = std::sqrt(beta_position * sqrt_d / kDim) / kPosAmplitude;
  for (int j = 0; j < 4; ++j) heads.read(kPositionHead, j, kPositionFeatures + j, w_position);
  heads.read(kPositionHead, 4, kConstFeature, std::sqrt(offset * beta_position * sqrt_d / kDim) / kConst, -1.0);
}

}  // namespace

ModelTensors designed_model() {
  ModelTensors m;
  m.config = designed_config();
  m.tensors = zero_tensors(m.config);
  set_patch_embedding(m);
  set_position_embedding(m);
  // LN1 is the identity affine (weight 1, bias 0): LN1(x) = sqrt(D) E f / |f|, so a head that
  // reads feature k through E^T sees sqrt(D) f_k / |f|. norm2 and the final norm too.
  for (const char* name : {"blocks.0.norm1.weight", "blocks.0.norm2.weight", "norm.weight"})
    for (float& v : m.tensors.at(name).values) v = 1.0f;
  set_attention(m);
  // The MLP has no designed role: fc1, fc2 and their biases are 0, so x passes through. There is no
  // classifier head.
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
