// Head-role lifts (core/render/head_roles.hpp) and the designed model's roles on
// the demo image and on real photographs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "test_support.hpp"
#include "models/bundled.hpp"
#include "core/render/head_roles.hpp"
#include "core/io/image.hpp"
#include "core/model/vit.hpp"

using namespace vitlens;

namespace {

// A 4 x 4 patch grid of a P = 4 config from a function of pixel (x, y) in [0, 1], grey, mean 0.5
// std 0.5 as the designed model (so normalised = 2 x - 1).
PatchGrid grid_of(int patches_w, int patches_h, const std::function<float(int, int, int)>& rgb) {
  const VitConfig config = test::small_config(4 * std::max(patches_w, patches_h));
  cv::Mat image(4 * patches_h, 4 * patches_w, CV_32FC3);
  for (int y = 0; y < image.rows; ++y)
    for (int x = 0; x < image.cols; ++x)
      for (int c = 0; c < 3; ++c) image.at<cv::Vec3f>(y, x)[c] = rgb(x, y, c);
  PatchGrid g;
  g.grid_w = patches_w;
  g.grid_h = patches_h;
  g.patches = patchify(image, config);
  g.patch_is_padding.assign(static_cast<size_t>(patches_w * patches_h), 0);
  return g;
}

// The lift of one head, computed the plain way from the (N, N) weights that keep_probs stores,
// with memberships from a full sort: the reference for head_role_scores.
std::vector<std::vector<RoleLifts>> reference_lifts(const VitConfig& config, const PatchGrid& grid,
                                                    const ForwardResult& r, double fraction) {
  const PatchDescriptors d = patch_descriptors(config, grid);
  const int patches = grid.grid_h * grid.grid_w, gw = grid.grid_w;
  std::vector<std::vector<RoleLifts>> sum(r.layers.size(), std::vector<RoleLifts>(static_cast<size_t>(config.num_heads), RoleLifts{}));
  std::vector<std::vector<int>> count(r.layers.size(), std::vector<int>(static_cast<size_t>(config.num_heads), 0));
  for (int i = 0; i < patches; ++i) {
    if (grid.patch_is_padding[static_cast<size_t>(i)]) continue;
    std::vector<int> keys;
    for (int j = 0; j < patches; ++j)
      if (j != i && !grid.patch_is_padding[static_cast<size_t>(j)] && r.mask.allows(r.prefix + i, r.prefix + j))
        keys.push_back(j);
    if (keys.size() < 2) continue;
    const double n = static_cast<double>(keys.size()), k = fraction * n;
    std::array<std::vector<double>, kHeadRoles> member;
    for (int role = 0; role < kHeadRoles; ++role) {
      std::vector<double> a;
      for (const int j : keys) {
        const size_t I = static_cast<size_t>(i), J = static_cast<size_t>(j);
        double v = 0.0;
        if (role == kRoleEdge) v = d.orientation[I][0] * d.orientation[J][0] + d.orientation[I][1] * d.orientation[J][1];
        if (role == kRoleTexture)
          for (size_t c = 0; c < 8; ++c) v -= std::pow(d.texture[I][c] - d.texture[J][c], 2);
        if (role == kRoleColour)
          for (size_t c = 0; c < 3; ++c) v -= std::pow(d.colour[I][c] - d.colour[J][c], 2);
        if (role == kRolePosition) v = -std::pow(j / gw - i / gw, 2) - std::pow(j % gw - i % gw, 2);
        a.push_back(v);
      }
      // Walk the distinct values from the top; a group that straddles place k shares what is left.
      std::vector<double> sorted = a;
      std::sort(sorted.begin(), sorted.end(), std::greater<double>());
      std::vector<double>& mu = member[static_cast<size_t>(role)];
      mu.assign(a.size(), 0.0);
      double placed = 0.0;
      for (size_t s = 0; s < sorted.size() && placed < k - 1e-12;) {
        size_t e = s;
        while (e < sorted.size() && sorted[e] == sorted[s]) ++e;
        const double group = static_cast<double>(e - s), share = std::min(1.0, (k - placed) / group);
        for (size_t j = 0; j < a.size(); ++j)
          if (a[j] == sorted[s]) mu[j] = share;
        placed += group * share;
        s = e;
      }
    }
    for (size_t l = 0; l < r.layers.size(); ++l)
      for (int h = 0; h < config.num_heads; ++h) {
        const MatRM& p = r.layers[l].probs[static_cast<size_t>(h)];
        double total = 0.0;
        for (const int j : keys) total += p(r.prefix + i, r.prefix + j);
        if (total <= 0.0) continue;
        for (int role = 0; role < kHeadRoles; ++role) {
          double mass = 0.0;
          for (size_t e = 0; e < keys.size(); ++e) mass += member[static_cast<size_t>(role)][e] * p(r.prefix + i, r.prefix + keys[e]);
          sum[l][static_cast<size_t>(h)][static_cast<size_t>(role)] += mass / total / (k / n);
        }
        ++count[l][static_cast<size_t>(h)];
      }
  }
  for (size_t l = 0; l < sum.size(); ++l)
    for (size_t h = 0; h < sum[l].size(); ++h)
      for (double& v : sum[l][h]) v /= std::max(1, count[l][h]);
  return sum;
}

std::string lift_table(const HeadRoleScores& s) {
  std::string text;
  char line[160];
  for (size_t h = 0; h < s.lift[0].size(); ++h) {
    const RoleLifts& v = s.lift[0][h];
    std::snprintf(line, sizeof line, "  head %zu: edge %.2f texture %.2f colour %.2f position %.2f\n", h, v[0], v[1], v[2], v[3]);
    text += line;
  }
  return text;
}

HeadRoleScores roles_on(const VitModel& model, const cv::Mat& rgb01, const std::string& what) {
  const PreparedImage image = prepare_image(rgb01, model.config, default_max_side(model.config), what);
  const ForwardResult r = forward(model, image.grid, ForwardOptions{});
  return head_role_scores(model, image.grid, r);
}

int argmax(const RoleLifts& v) { return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin()); }

}  // namespace

TEST_CASE("head role descriptors of hand-made patches", "[head_roles]") {
  // Patches left to right: flat grey; a vertical step (dark | bright at x = 2); a horizontal step;
  // vertical stripes of period 2; a flat red.
  const PatchGrid g = grid_of(5, 1, [](int x, int y, int c) -> float {
    switch (x / 4) {
      case 1: return x % 4 >= 2 ? 1.0f : 0.0f;
      case 2: return y % 4 >= 2 ? 1.0f : 0.0f;
      case 3: return x % 2 == 0 ? 1.0f : 0.0f;
      case 4: return c == 0 ? 1.0f : 0.0f;
    }
    return 0.5f;
  });
  const PatchDescriptors d = patch_descriptors(test::small_config(20), g);
  // Orientation: J = mean over the nine 2x2 cells. The vertical step has gx = 1 on the three cells
  // straddling it: Jxx = 1/3, Jyy = Jxy = 0, so o = (1/3 / (1/3 + 1e-4), 0); the horizontal step
  // the same with the sign flipped (a doubled angle: 90 degrees -> 180).
  const double step = (1.0 / 3.0) / (1.0 / 3.0 + 1e-4);
  CHECK(d.orientation[0][0] == Approx(0.0).margin(1e-12));
  CHECK(d.orientation[1][0] == Approx(step).epsilon(1e-9));
  CHECK(d.orientation[1][1] == Approx(0.0).margin(1e-12));
  CHECK(d.orientation[2][0] == Approx(-step).epsilon(1e-9));
  // Stripes of period 2: every cell has gx = +-1 averaged over its two rows, gy = 0: Jxx = 1.
  CHECK(d.orientation[3][0] == Approx(1.0 / (1.0 + 1e-4)).epsilon(1e-9));
  // Texture: flat patches have log(1e-4) everywhere; the stripes differ by 1 on every horizontal
  // and diagonal lag-1 pair, by 0 vertically and at lag 2 horizontally.
  for (size_t c = 0; c < 8; ++c) CHECK(d.texture[0][c] == Approx(std::log(1e-4)));
  CHECK(d.texture[3][0] == Approx(std::log(1.0 + 1e-4)));  // (0, 1) lag 1
  CHECK(d.texture[3][1] == Approx(std::log(1e-4)));         // (1, 0) lag 1
  CHECK(d.texture[3][2] == Approx(std::log(1.0 + 1e-4)));  // (1, 1) lag 1
  CHECK(d.texture[3][4] == Approx(std::log(1e-4)));         // (0, 1) lag 2
  // The vertical step at lag 1 horizontally: 4 of its 12 pairs differ by 1.
  CHECK(d.texture[1][0] == Approx(std::log(1e-4 + 4.0 / 12.0)));
  // Colour: mean RGB in [0, 1], after undoing the normalisation.
  CHECK(d.colour[0][1] == Approx(0.5));
  CHECK(d.colour[4][0] == Approx(1.0));
  CHECK(d.colour[4][2] == Approx(0.0).margin(1e-7));
}

TEST_CASE("head role lifts equal a plain reference from the full weight matrices", "[head_roles]") {
  // A random model with far-from-uniform attention, an image whose size is not a multiple of the
  // patch (padding patches), and the causal mask: every rule of the definition is exercised.
  const VitConfig config = test::small_config(32, true, 2);
  const VitModel model = test::random_model(config, 17, 0.5f);
  cv::Mat rgb(30, 26, CV_32FC3);
  cv::RNG rng(5);
  rng.fill(rgb, cv::RNG::UNIFORM, 0.0, 1.0);
  // A flat band: exact ties in every role but position.
  rgb(cv::Rect(0, 0, 26, 8)).setTo(cv::Scalar(0.3, 0.6, 0.2));
  const PreparedImage image = prepare_image(rgb, config, 0, "test image");
  REQUIRE(std::count(image.grid.patch_is_padding.begin(), image.grid.patch_is_padding.end(), 1) > 0);
  for (const bool causal : {false, true}) {
    INFO("causal " << causal);
    ForwardOptions options;
    options.causal = causal;
    options.keep_probs = true;
    const ForwardResult r = forward(model, image.grid, options);
    for (const double fraction : {0.1, 0.25, 1.0}) {
      INFO("top fraction " << fraction);
      HeadRoleOptions o;
      o.top_fraction = fraction;
      o.max_queries = 0;  // every query, as the reference
      const HeadRoleScores s = head_role_scores(model, image.grid, r, o);
      const auto ref = reference_lifts(config, image.grid, r, fraction);
      REQUIRE(s.lift.size() == 2);
      double worst = 0.0;
      for (size_t l = 0; l < 2; ++l)
        for (size_t h = 0; h < 4; ++h)
          for (size_t role = 0; role < kHeadRoles; ++role) {
            worst = std::max(worst, std::abs(s.lift[l][h][role] - ref[l][h][role]));
            if (fraction == 1.0) CHECK(s.lift[l][h][role] == Approx(1.0).epsilon(1e-5));  // every key is a member
          }
      INFO("largest difference " << worst);
      CHECK(worst < 1e-5);  // float weights summed in double: far below this
    }
  }
}

TEST_CASE("uniform attention or an all-tied image gives lift 1 on every role", "[head_roles]") {
  // Zero W_q, W_k: every score is 0, attention is uniform over the allowed keys.
  ModelTensors designed = designed_model();
  for (float& v : designed.tensors.at("blocks.0.attn.qkv.weight").values) v = 0.0f;
  for (float& v : designed.tensors.at("blocks.0.attn.qkv.bias").values) v = 0.0f;
  const VitModel uniform = model_from_tensors(designed.config, designed.tensors, "uniform");
  const HeadRoleScores s = roles_on(uniform, load_image_rgb(default_image_path()), "demo");
  CHECK(s.queries == 256);
  for (const RoleLifts& v : s.lift[0])
    for (const double x : v) CHECK(x == Approx(1.0).epsilon(1e-5));
  // A flat image: every affinity but position ties; a sharp random model still scores 1 there.
  const VitModel sharp = test::random_model(test::small_config(32), 3, 0.6f);
  const cv::Mat flat(32, 32, CV_32FC3, cv::Scalar(0.2, 0.4, 0.6));
  const HeadRoleScores f = roles_on(sharp, flat, "flat");
  for (const RoleLifts& v : f.lift[0])
    for (const int role : {kRoleEdge, kRoleTexture, kRoleColour}) CHECK(v[static_cast<size_t>(role)] == Approx(1.0).epsilon(1e-6));
}

TEST_CASE("head roles reject a bad option and a mismatched forward", "[head_roles]") {
  const VitModel model = test::random_model(test::small_config(16), 1);
  const PreparedImage a = prepare_image(cv::Mat(16, 16, CV_32FC3, cv::Scalar(0.5, 0.5, 0.5)), model.config, 0);
  const PreparedImage b = prepare_image(cv::Mat(8, 16, CV_32FC3, cv::Scalar(0.5, 0.5, 0.5)), model.config, 0);
  const ForwardResult r = forward(model, a.grid, ForwardOptions{});
  HeadRoleOptions bad;
  bad.top_fraction = 0.0;
  CHECK_THROWS_WITH(head_role_scores(model, a.grid, r, bad), Catch::Contains("top_fraction"));
  CHECK_THROWS_WITH(head_role_scores(model, b.grid, r), Catch::Contains("not made from this patch grid"));
  CHECK_THROWS_WITH(head_role_scores(model, a.grid, r, {}, [](float) { return false; }), Catch::Contains("cancelled"));
}

TEST_CASE("on the demo image each designed head scores highest on its own role", "[head_roles][bundled]") {
  const cv::Mat demo = load_image_rgb(default_image_path());
  const HeadRoleScores designed = roles_on(load_model(default_model_path()), demo, "demo");
  const HeadRoleScores random = roles_on(load_model(random_model_path()), demo, "demo");
  INFO("designed\n" << lift_table(designed) << "random\n" << lift_table(random));
  for (int h = 0; h < 4; ++h) {
    INFO("head " << h);
    CHECK(argmax(designed.lift[0][static_cast<size_t>(h)]) == h);
  }
  // The random control: no role clearly above the others (its attention is close to uniform).
  for (const RoleLifts& v : random.lift[0]) {
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    CHECK(*hi - *lo < 0.15);
    CHECK(*lo > 0.85);
    CHECK(*hi < 1.15);
  }
}

// Real photographs from Debian's opencv-doc (read in place, never copied). On each photo a head
// passes when its own role has the highest lift of its four, or when its own-role lift is at least
// 1.3 times the random control's on that role; each head must pass on at least 3 of 4 photos.
TEST_CASE("on real photos each designed head does its role", "[head_roles][bundled][photos]") {
  const std::string folder = "/usr/share/doc/opencv-doc/examples/data/";
  const char* const photos[] = {"baboon.jpg",  "building.jpg", "fruits.jpg",      "home.jpg",
                                "messi5.jpg",  "squirrel_cls.jpg", "butterfly.jpg", "aero1.jpg",
                                "leuvenA.jpg", "orange.jpg",   "starry_night.jpg", "board.jpg"};
  for (const char* p : photos) {
    INFO("missing " << folder << p << ": install the Debian package opencv-doc (scripts/setup.sh does)");
    REQUIRE(std::filesystem::is_regular_file(folder + p));
  }
  const VitModel designed = load_model(default_model_path());
  const VitModel random = load_model(random_model_path());
  int passes[4] = {}, highest[4] = {};
  std::string report;
  for (const char* p : photos) {
    const cv::Mat rgb = load_image_rgb(folder + p);
    const HeadRoleScores d = roles_on(designed, rgb, p), r = roles_on(random, rgb, p);
    report += std::string(p) + "\n" + lift_table(d) + "  random model, heads 0-3 on their designed roles:";
    for (int h = 0; h < 4; ++h) report += " " + std::to_string(r.lift[0][static_cast<size_t>(h)][static_cast<size_t>(h)]).substr(0, 4);
    report += "\n";
    for (int h = 0; h < 4; ++h) {
      const RoleLifts& v = d.lift[0][static_cast<size_t>(h)];
      const bool top = argmax(v) == h;
      highest[h] += top;
      passes[h] += top || v[static_cast<size_t>(h)] >= 1.3 * r.lift[0][static_cast<size_t>(h)][static_cast<size_t>(h)];
    }
  }
  const int n = static_cast<int>(sizeof photos / sizeof photos[0]);
  for (int h = 0; h < 4; ++h)
    report += "head " + std::to_string(h) + " (" + head_role_name(h) + "): own role highest on " +
              std::to_string(highest[h]) + " of " + std::to_string(n) + " photos, passes on " + std::to_string(passes[h]) + "\n";
  INFO(report);  // the numbers README.md and assets/README.md quote (run with -s to see them)
  for (int h = 0; h < 4; ++h) {
    INFO("head " << h);
    CHECK(4 * passes[h] >= 3 * n);
  }
}

// The position head attends near the query on any photo, whatever the query patch's contrast:
// LayerNorm's 1 / |f| shrinks every score of a textured patch (s_i s_j), and the old design's
// score (three frequencies per axis, positive along the query's whole row and column) then sent
// up to half of a textured query's mass 16 or more patches away. Queries are split by the
// luminance standard deviation of their patch: flat below 0.01, textured above 0.05 (pixel units).
TEST_CASE("on real photos the designed position head stays near the query, flat or textured", "[head_roles][bundled][photos]") {
  const std::string folder = "/usr/share/doc/opencv-doc/examples/data/";
  // Mostly flat (a logo, an orange on a plain ground, a room) to mostly textured (fur, a painting,
  // a chessboard photo).
  const char* const photos[] = {"WindowsLogo.jpg", "orange.jpg", "home.jpg", "aero1.jpg",
                                "baboon.jpg",      "starry_night.jpg", "board.jpg"};
  const VitModel model = load_model(default_model_path());
  std::string report;
  for (const char* p : photos) {
    INFO("missing " << folder << p << ": install the Debian package opencv-doc (scripts/setup.sh does)");
    REQUIRE(std::filesystem::is_regular_file(folder + p));
    const PreparedImage image = prepare_image(load_image_rgb(folder + p), model.config, default_max_side(model.config), p);
    const ForwardResult r = forward(model, image.grid, ForwardOptions{});
    const HeadRoleScores roles = head_role_scores(model, image.grid, r);
    const int gw = r.grid_w, patches = r.grid_h * r.grid_w, area = 16;
    std::vector<float> row(static_cast<size_t>(r.tokens));
    double near[2] = {}, far[2] = {};  // [flat, textured]: mass share within Chebyshev 3, at 16 or more
    int count[2] = {};
    for (int i = 0; i < patches; i += 3) {
      if (image.grid.patch_is_padding[static_cast<size_t>(i)]) continue;
      const float* v = image.grid.patches.row(i).data();  // (3, 4, 4) normalised, mean = std = 0.5
      double lum[area] = {}, mean = 0.0, var = 0.0;
      for (int c = 0; c < 3; ++c)
        for (int e = 0; e < area; ++e) lum[e] += (0.5 * v[c * area + e] + 0.5) / 3.0;
      for (const double x : lum) mean += x / area;
      for (const double x : lum) var += (x - mean) * (x - mean) / area;
      const double sd = std::sqrt(var);
      const int kind = sd < 0.01 ? 0 : sd > 0.05 ? 1 : -1;
      if (kind < 0) continue;
      attention_row(model, r, 0, kPositionHead, r.prefix + i, row.data());
      double total = 0.0, within = 0.0, beyond = 0.0;
      for (int j = 0; j < patches; ++j) {
        const double w = row[static_cast<size_t>(r.prefix + j)];
        const int d = std::max(std::abs(j / gw - i / gw), std::abs(j % gw - i % gw));
        total += w;
        within += d <= 3 ? w : 0.0;
        beyond += d >= 16 ? w : 0.0;
      }
      near[kind] += within / total;
      far[kind] += beyond / total;
      ++count[kind];
    }
    const double lift = roles.lift[0][kPositionHead][kRolePosition];
    char line[200];
    std::snprintf(line, sizeof line, "%-17s position lift %.2f; flat queries (%d): %.3f within 3, %.3f at 16+; textured (%d): %.3f, %.3f\n",
                  p, lift, count[0], count[0] ? near[0] / count[0] : 0.0, count[0] ? far[0] / count[0] : 0.0, count[1],
                  count[1] ? near[1] / count[1] : 0.0, count[1] ? far[1] / count[1] : 0.0);
    report += line;
    INFO(line);
    CHECK(lift >= 9.0);  // 10 = every bit of the mass on the 10 % nearest keys
    for (int kind = 0; kind < 2; ++kind) {
      if (count[kind] == 0) continue;
      CHECK(near[kind] / count[kind] >= 0.9);
      CHECK(far[kind] / count[kind] <= 0.01);
    }
  }
  std::printf("%s", report.c_str());
}
