// The forward pass's bookkeeping: positional interpolation, masks over a real grid, the stored
// rows and received maps against the full probability matrices.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <thread>

#include "test_support.hpp"
#include "core/cpu/fast_attention.hpp"
#include "core/cpu/gemm.hpp"
#include "core/io/image.hpp"
#include "core/render/maps.hpp"
#include "core/model/vit.hpp"

using namespace vitlens;

namespace {

PatchGrid random_grid(const VitConfig& c, int gh, int gw, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  PatchGrid g;
  g.grid_h = gh;
  g.grid_w = gw;
  g.patches.resize(gh * gw, c.patch_values());
  for (Eigen::Index i = 0; i < g.patches.size(); ++i) g.patches.data()[i] = dist(rng);
  g.patch_is_padding.assign(static_cast<size_t>(gh * gw), 0);
  return g;
}

}  // namespace

TEST_CASE("positional table: unchanged at the model's grid, exact on linear ramps when resized", "[vit][pos]") {
  VitConfig c = test::small_config(32);  // 8x8 grid
  TensorMap t = test::random_tensors(c, 11);
  // pos[prefix + r*8 + col][ch] = 0.5*col - 0.25*r + ch: linear in both grid axes.
  auto& pos = t.at("pos_embed").values;
  for (int r = 0; r < 8; ++r)
    for (int col = 0; col < 8; ++col)
      for (int ch = 0; ch < c.embed_dim; ++ch) pos[static_cast<size_t>((1 + r * 8 + col) * c.embed_dim + ch)] = 0.5f * col - 0.25f * r + ch;
  const VitModel m = model_from_tensors(c, t, "ramp");

  const MatRM same = positional_table(m, 8, 8);
  CHECK(same == ConstMapRM(m.w.pos_embed, 65, c.embed_dim));

  const MatRM big = positional_table(m, 12, 10);
  REQUIRE(big.rows() == 1 + 12 * 10);
  CHECK(big.row(0) == ConstMapRM(m.w.pos_embed, 65, c.embed_dim).row(0));  // class token row kept
  // Reference values from PyTorch 1.13 for the channel-0 ramp, rows 2..4 and columns 2..4 of
  //   F.interpolate(g, size=(12, 10), mode="bicubic", align_corners=False)
  // with g[0, 0, r, c] = 0.5 * c - 0.25 * r on the 8x8 grid. (A = -0.75 cubic convolution does not
  // reproduce linear functions exactly, so these are not simply the ramp at the source point.)
  const float torch_block[3][3] = {{0.4468f, 0.8678f, 1.2648f}, {0.3032f, 0.7242f, 1.1212f}, {0.1250f, 0.5460f, 0.9430f}};
  for (int r = 0; r < 3; ++r)
    for (int col = 0; col < 3; ++col) {
      CHECK(big(1 + (r + 2) * 10 + col + 2, 0) == Approx(torch_block[r][col]).margin(1e-4));
      CHECK(big(1 + (r + 2) * 10 + col + 2, 5) == Approx(torch_block[r][col] + 5.0f).margin(1e-4));
    }
  // The cubic weights sum to one, so a constant table stays constant at any size.
  for (int ch = 0; ch < c.embed_dim; ++ch) pos[0] = 0.0f;
  for (size_t i = static_cast<size_t>(c.embed_dim); i < pos.size(); ++i) pos[i] = 0.75f;
  const VitModel flat = model_from_tensors(c, t, "flat");
  const MatRM small = positional_table(flat, 3, 5);
  CHECK((small.bottomRows(15).array() - 0.75f).abs().maxCoeff() < 1e-6f);
}

TEST_CASE("forward: stored rows, class-token rows and received maps match the full matrices", "[vit]") {
  // 13x12 patches + class token = 157 tokens: several 64-row blocks and a ragged last block.
  VitConfig c = test::small_config(16, true, 2);
  const VitModel m = test::random_model(c, 21);
  const PatchGrid g = random_grid(c, 13, 12, 5);
  for (bool causal : {false, true}) {
    DYNAMIC_SECTION((causal ? "causal" : "no mask")) {
      ForwardOptions o;
      o.keep_probs = true;
      o.causal = causal;
      const ForwardResult r = forward(m, g, o);
      REQUIRE(r.tokens == 157);
      REQUIRE(r.layers.size() == 2);
      double worst = 0.0;
      for (int l = 0; l < 2; ++l)
        for (int h = 0; h < 4; ++h) {
          const MatRM& p = r.layers[l].probs[h];
          // The reference attention on this layer's q, k, v reproduces the stored matrix.
          const int d = c.head_dim();
          const MatRM q = r.layers[l].qkv.middleCols(h * d, d), k = r.layers[l].qkv.middleCols(48 + h * d, d),
                      v = r.layers[l].qkv.middleCols(96 + h * d, d);
          const AttentionResult ref = scaled_dot_product_attention(q, k, v, r.mask);
          worst = std::max(worst, static_cast<double>((ref.weights - p).cwiseAbs().maxCoeff()));
          for (int i = 0; i < r.tokens; ++i) CHECK(p.row(i).sum() == Approx(1.0).epsilon(1e-5));
          if (causal) CHECK(p.triangularView<Eigen::StrictlyUpper>().toDenseMatrix().isZero(0.0f));
          std::vector<float> row(static_cast<size_t>(r.tokens));
          for (int i : {0, 1, 63, 64, 100, 156}) {
            attention_row(m, r, l, h, i, row.data());
            for (int j = 0; j < r.tokens; ++j) worst = std::max(worst, static_cast<double>(std::abs(row[j] - p(i, j))));
          }
          worst = std::max(worst, static_cast<double>((r.layers[l].cls_row.row(h) - p.row(0)).cwiseAbs().maxCoeff()));
          const RowVecF col_mean = p.colwise().sum() / static_cast<float>(r.tokens);
          worst = std::max(worst, static_cast<double>((r.layers[l].received.row(h) - col_mean).cwiseAbs().maxCoeff()));
        }
      // Two softmaxes of the same scores (the blocked kernel's fast_exp, within 1 ulp, and its
      // blocked sums against Eigen's std::exp and sums) differ by a few ulp of the largest
      // weights: ulp(1) = 1.2e-7. Measured: 8.9e-7 and 9.5e-7 (g++, AVX-512 kernels, both sections),
      // 1.013e-6 (clang 14's ASan build, AVX-512), so 1e-6 was too tight; a mask or index error
      // moves weights by 1e-3 and more.
      INFO("largest difference " << worst);
      CHECK(worst < 2e-6);
    }
  }
}

TEST_CASE("padding mask: padded patches are never attended to and do not count as queries", "[vit][mask]") {
  VitConfig c = test::small_config(16, true);
  const VitModel m = test::random_model(c, 8);
  // 10x9 pixels -> padded to 12x12 -> 3x3 patches; the last column and last row are padding.
  cv::Mat img(9, 10, CV_32FC3);
  cv::randu(img, 0.0f, 1.0f);
  const PreparedImage p = prepare_image(img, c, 0);
  REQUIRE(p.grid.grid_h == 3);
  REQUIRE(p.grid.grid_w == 3);
  REQUIRE(p.padded_w == 12);
  REQUIRE(p.padded_h == 12);
  const std::vector<uint8_t> expected_padding = {0, 0, 1, 0, 0, 1, 1, 1, 1};
  CHECK(p.grid.patch_is_padding == expected_padding);
  ForwardOptions o;
  o.keep_probs = true;
  const ForwardResult r = forward(m, p.grid, o);
  CHECK(r.received_queries == 1 + 4);
  for (int h = 0; h < 4; ++h) {
    const MatRM& probs = r.layers[0].probs[h];
    for (int patch = 0; patch < 9; ++patch)
      if (expected_padding[patch]) {
        CHECK(probs.col(1 + patch).isZero(0.0f));
        CHECK(r.layers[0].received(h, 1 + patch) == 0.0f);
      }
    // received averages the class token and the four real patches' rows only
    RowVecF mean = probs.row(0);
    for (int patch : {0, 1, 3, 4}) mean += probs.row(1 + patch);
    mean /= 5.0f;
    CHECK((r.layers[0].received.row(h) - mean).cwiseAbs().maxCoeff() < 1e-6f);
  }
  // Turning the padding mask off lets attention reach the padded patches again.
  o.mask_padding = false;
  const ForwardResult open = forward(m, p.grid, o);
  CHECK(open.layers[0].probs[0].col(1 + 2).maxCoeff() > 0.0f);
}

TEST_CASE("painted mask, score scale and maps", "[vit][maps]") {
  VitConfig c = test::small_config(16, true);
  const VitModel m = test::random_model(c, 4);
  const PatchGrid g = random_grid(c, 4, 4, 9);
  ForwardOptions o;
  o.forbidden_patches.assign(16, 0);
  o.forbidden_patches[5] = 1;
  o.keep_probs = true;
  const ForwardResult r = forward(m, g, o);
  for (int h = 0; h < 4; ++h) CHECK(r.layers[0].probs[h].col(1 + 5).isZero(0.0f));

  ForwardOptions flat;
  flat.score_scale = 0.0f;  // every score 0: uniform attention
  const ForwardResult u = forward(m, g, flat);
  std::vector<float> row(17);
  attention_row(m, u, 0, 2, 3, row.data());
  for (float w : row) CHECK(w == Approx(1.0f / 17.0f).epsilon(1e-6));

  MapRequest req;
  req.mode = MapMode::Query;
  req.query_token = token_at_patch(c, r.grid_h, r.grid_w, 2, 1);
  CHECK(req.query_token == 1 + 2 * 4 + 1);
  CHECK(token_at_pixel(c, r.grid_h, r.grid_w, 5, 9) == 1 + 2 * 4 + 1);
  const HeadMaps maps = attention_maps(m, r, req);
  REQUIRE(maps.heads.size() == 4);
  MatRM mean = MatRM::Zero(4, 4);
  for (int h = 0; h < 4; ++h) {
    for (int patch = 0; patch < 16; ++patch)
      CHECK(maps.heads[h](patch / 4, patch % 4) == Approx(r.layers[0].probs[h](req.query_token, 1 + patch)).margin(1e-7));
    CHECK(maps.cls_weight[h] == Approx(r.layers[0].probs[h](req.query_token, 0)).margin(1e-7));
    mean += maps.heads[h] / 4.0f;
  }
  CHECK((maps.mean - mean).cwiseAbs().maxCoeff() < 1e-7f);

  CHECK_THROWS_WITH(token_at_patch(c, r.grid_h, r.grid_w, 4, 0), Catch::Contains("outside"));
  CHECK_THROWS_WITH(token_at_pixel(c, r.grid_h, r.grid_w, -1, 0), Catch::Contains("outside"));
  req.layer = 1;
  CHECK_THROWS_WITH(attention_maps(m, r, req), Catch::Contains("layer 1"));

  const VitModel no_cls = test::random_model(test::small_config(16, false), 4);
  const ForwardResult nr = forward(no_cls, g, ForwardOptions{});
  MapRequest cls_req;
  cls_req.mode = MapMode::ClassToken;
  CHECK_THROWS_WITH(attention_maps(no_cls, nr, cls_req), Catch::Contains("no class token"));
}

TEST_CASE("config validation names the inconsistent key", "[vit][config]") {
  VitConfig c = test::small_config();
  CHECK(c.validate().empty());
  c.embed_dim = 50;
  CHECK_THAT(c.validate(), Catch::Contains("not divisible by num_heads"));
  c = test::small_config();
  c.img_h = 30;
  CHECK_THAT(c.validate(), Catch::Contains("multiple of patch_size"));
  c = test::small_config();
  c.std[1] = 0.0f;
  CHECK_THAT(c.validate(), Catch::Contains("std[1]"));
}

namespace {

// Every float forward() returns that the viewer reads: tokens, every layer's q/k/v, received maps,
// class-token rows and key panels.
std::vector<float> forward_floats(const ForwardResult& r) {
  std::vector<float> all(r.output.data(), r.output.data() + r.output.size());
  for (const LayerState& s : r.layers)
    for (const MatRM* m : {&s.qkv, &s.received, &s.cls_row, &s.key_panels}) all.insert(all.end(), m->data(), m->data() + m->size());
  return all;
}

struct ForwardIsaGuard {
  KernelIsa saved = kernel_isa();
  ~ForwardIsaGuard() { set_kernel_isa(saved); }
};

}  // namespace

TEST_CASE("forward: the model's packed Linear weights are made once, reused, and made again for other kernels",
          "[vit][packed]") {
  ForwardIsaGuard guard;
  VitConfig c = test::small_config(20, true, 2);  // 26 tokens: edge tiles in every product
  const TensorMap tensors = test::random_tensors(c, 5);
  VitModel m = model_from_tensors(c, tensors, "packed");
  const PatchGrid g = random_grid(c, 5, 5, 9);
  ForwardOptions opt;
  opt.threads = 1;
  REQUIRE(m.packed_cache);
  CHECK_FALSE(m.packed_cache->packed);  // nothing packed before the first forward

  const std::vector<float> first = forward_floats(forward(m, g, opt));
  REQUIRE(m.packed_cache->packed);
  const PackedModelWeights* made = m.packed_cache->packed.get();
  CHECK(made->kernels == &detail::active_gemm_kernels());
  REQUIRE(made->blocks.size() == 2);
  CHECK(made->blocks[1][2].w == m.w.blocks[1].fc1_w);

  // Reused: the same object, the same bits, on 1 and 2 threads.
  for (int threads : {1, 2}) {
    opt.threads = threads;
    CHECK(forward_floats(forward(m, g, opt)) == first);
    CHECK(m.packed_cache->packed.get() == made);
  }
  opt.threads = 1;

  // Moved with the model; a model without a cache packs per call and gives the same bits.
  VitModel moved = std::move(m);
  REQUIRE(moved.packed_cache);
  CHECK(moved.packed_cache->packed.get() == made);
  CHECK(forward_floats(forward(moved, g, opt)) == first);
  moved.packed_cache.reset();
  CHECK(forward_floats(forward(moved, g, opt)) == first);

  // Another instruction set: packed again for its tiles, and the same numbers a model loaded under
  // that instruction set gives (within 1e-5 of the first kernels').
  for (KernelIsa isa : {KernelIsa::Portable, KernelIsa::Avx2, KernelIsa::Avx512}) {
    if (!kernel_isa_supported(isa)) continue;
    INFO(kernel_isa_name(isa));
    set_kernel_isa(isa);
    // Packed for `isa`, then for the default kernels, then for `isa` again: each time the copy
    // for the kernels in use (a stale copy would still give right numbers, since
    // linear_forward_packed then packs W itself, so the kernels are checked).
    VitModel cached = model_from_tensors(c, tensors, "cached");
    (void)forward(cached, g, opt);
    CHECK(cached.packed_cache->packed->kernels == &detail::active_gemm_kernels());
    set_kernel_isa(guard.saved);
    (void)forward(cached, g, opt);
    CHECK(cached.packed_cache->packed->kernels == &detail::active_gemm_kernels());
    set_kernel_isa(isa);
    const std::vector<float> again = forward_floats(forward(cached, g, opt));
    CHECK(cached.packed_cache->packed->kernels == &detail::active_gemm_kernels());
    const VitModel fresh = model_from_tensors(c, tensors, "fresh");
    CHECK(forward_floats(forward(fresh, g, opt)) == again);
    REQUIRE(again.size() == first.size());
    double worst = 0.0;
    for (size_t i = 0; i < again.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(again[i]) - first[i]) / (1.0 + std::abs(first[i])));
    CHECK(worst < 1e-5);
  }
  set_kernel_isa(guard.saved);

  // Two threads running the first forward of a model at once: both the same bits.
  const VitModel shared = model_from_tensors(c, tensors, "shared");
  std::vector<float> a, b;
  std::thread other([&] { a = forward_floats(forward(shared, g, opt)); });
  b = forward_floats(forward(shared, g, opt));
  other.join();
  CHECK(a == first);
  CHECK(b == first);
}
