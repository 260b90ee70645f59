// The bundled designed model does what its head descriptions claim, measured on the demo image
// with the demo's own per-patch labels; the random control of the same shape does not. And the
// committed assets are exactly what the generators make now, so they cannot go stale.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "models/bundled.hpp"
#include "core/io/image.hpp"
#include "core/model/vit.hpp"

using namespace vitlens;

namespace {

// One measure per designed head: does key patch k count as a match for query patch q?
//   0 edges     same edge class (gradient direction, 45-degree steps)
//   1 texture   any texture tile (the head compares how textured patches are, not which tile:
//               assets/README.md says why a depth-1 head cannot tell the tiles apart robustly)
//   2 colour    same hue class
//   3 position  Chebyshev distance <= 1 (the query's 3 x 3 neighbourhood)
// Queries: the patches that have a class (heads 0-2) or every patch (head 3).
constexpr int kMeasures = 4;
const char* const kMeasureNames[kMeasures] = {"same edge direction", "any texture tile", "same hue",
                                              "3x3 neighbourhood"};

const std::vector<int>* class_labels(const DemoImage& demo, int measure) {
  // Tile patches as one class (0), the rest -1.
  static const std::vector<int> textured = [&] {
    std::vector<int> t(demo.texture_class.size());
    for (size_t i = 0; i < t.size(); ++i) t[i] = demo.texture_class[i] >= 0 ? 0 : -1;
    return t;
  }();
  switch (measure) {
    case kEdgeHead: return &demo.edge_class;
    case kTextureHead: return &textured;
    case kColourHead: return &demo.colour_class;
  }
  return nullptr;
}

// share[head][measure]: the attention mass a head puts on matching patch keys, as a fraction of
// its mass on all patch keys, averaged over the measure's query patches.
struct Shares {
  double share[4][kMeasures] = {};
  int queries[kMeasures] = {};
};

Shares measure_shares(const VitModel& model, const cv::Mat& rgb01, const DemoImage& demo) {
  const PreparedImage image = prepare_image(rgb01, model.config, default_max_side(model.config), "demo image");
  REQUIRE(image.grid.grid_h == demo.grid_h);
  REQUIRE(image.grid.grid_w == demo.grid_w);
  const ForwardResult result = forward(model, image.grid, ForwardOptions{});
  const int gw = demo.grid_w, patches = demo.grid_h * demo.grid_w, prefix = result.prefix;

  Shares out;
  std::vector<float> row(static_cast<size_t>(result.tokens));
  for (int m = 0; m < kMeasures; ++m) {
    const std::vector<int>* labels = class_labels(demo, m);
    double sums[4] = {};
    for (int q = 0; q < patches; ++q) {
      if (labels && (*labels)[q] < 0) continue;
      ++out.queries[m];
      for (int h = 0; h < model.config.num_heads; ++h) {
        attention_row(model, result, 0, h, prefix + q, row.data());  // (N) over all tokens
        double match = 0.0, total = 0.0;
        for (int k = 0; k < patches; ++k) {
          const double w = row[static_cast<size_t>(prefix + k)];
          total += w;
          const bool matches = labels ? (*labels)[k] == (*labels)[q]
                                      : std::abs(k / gw - q / gw) <= 1 && std::abs(k % gw - q % gw) <= 1;
          if (matches) match += w;
        }
        sums[h] += total > 0.0 ? match / total : 0.0;
      }
    }
    for (int h = 0; h < model.config.num_heads; ++h)
      out.share[h][m] = out.queries[m] > 0 ? sums[h] / out.queries[m] : 0.0;
  }
  return out;
}

std::string table(const char* title, const Shares& s) {
  std::string text = std::string(title) + " (rows: heads, columns: measures)\n";
  char line[160];
  for (int h = 0; h < 4; ++h) {
    std::snprintf(line, sizeof line, "  head %d: %.3f %.3f %.3f %.3f\n", h, s.share[h][0], s.share[h][1],
                  s.share[h][2], s.share[h][3]);
    text += line;
  }
  return text;
}

// Both models on the committed demo image, computed once for all sections.
struct Measured {
  DemoImage demo = make_demo_image();
  Shares designed, random;
  Measured() {
    const cv::Mat rgb01 = load_image_rgb(default_image_path());
    designed = measure_shares(load_model(default_model_path()), rgb01, demo);
    random = measure_shares(load_model(random_model_path()), rgb01, demo);
  }
};

const Measured& measured() {
  static const Measured m;
  return m;
}

bool same_tensors(const TensorMap& a, const TensorMap& b, std::string& why) {
  if (a.size() != b.size()) {
    why = "tensor count " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
    return false;
  }
  for (const auto& [name, t] : a) {
    const auto it = b.find(name);
    if (it == b.end()) { why = "missing tensor " + name; return false; }
    if (t.shape != it->second.shape) { why = "shape of " + name; return false; }
    for (size_t i = 0; i < t.values.size(); ++i)
      if (t.values[i] != it->second.values[i]) {  // bit for bit: the generators are deterministic
        why = name + "[" + std::to_string(i) + "] " + std::to_string(t.values[i]) + " vs " +
              std::to_string(it->second.values[i]);
        return false;
      }
  }
  return true;
}

}  // namespace

TEST_CASE("bundled assets match their generators", "[bundled]") {
  // If this fails after a change to bundled_model.cpp or demo_image.cpp, regenerate the assets:
  //   build/models/vitlens_make_assets assets
  INFO("regenerate with: vitlens_make_assets <source>/assets");
  const ModelTensors made[2] = {designed_model(), random_model()};
  const std::string paths[2] = {default_model_path(), random_model_path()};
  for (int i = 0; i < 2; ++i) {
    INFO(paths[i]);
    const SafetensorsFile file = read_safetensors(paths[i]);
    std::string why;
    const bool same = same_tensors(made[i].tensors, file.tensors, why);
    INFO(why);
    CHECK(same);
    REQUIRE(file.metadata.count("config") == 1);
    CHECK(nlohmann::json::parse(file.metadata.at("config")) == config_to_json(made[i].config));
  }

  const DemoImage demo = make_demo_image();
  const cv::Mat png = cv::imread(default_image_path(), cv::IMREAD_UNCHANGED);
  REQUIRE(png.type() == CV_8UC3);
  cv::Mat png_rgb;
  cv::cvtColor(png, png_rgb, cv::COLOR_BGR2RGB);
  REQUIRE(png_rgb.size() == demo.rgb.size());
  CHECK(cv::norm(png_rgb, demo.rgb, cv::NORM_INF) == 0.0);
}

TEST_CASE("the designed model is what its config says", "[bundled]") {
  const ModelTensors m = designed_model();
  CHECK(m.config.validate().empty());
  CHECK(m.config.depth == 1);
  CHECK(m.config.patch_size == 4);
  CHECK(m.config.embed_dim == 48);
  CHECK(m.config.num_heads == 4);
  CHECK(m.config.class_token);
  CHECK(m.config.description.find("Hand-designed") != std::string::npos);
  REQUIRE(m.config.head_descriptions.size() == 1);
  CHECK(m.config.head_descriptions[0].size() == 4);
  // A different seed gives a different control; the same seed the same one.
  CHECK(random_model(1).tensors.at("blocks.0.attn.qkv.weight").values !=
        random_model(2).tensors.at("blocks.0.attn.qkv.weight").values);
  CHECK(random_model(1).tensors.at("pos_embed").values == random_model(1).tensors.at("pos_embed").values);
}

TEST_CASE("the demo image has every class the designed heads look for", "[bundled]") {
  const DemoImage demo = make_demo_image();
  REQUIRE(demo.rgb.type() == CV_8UC3);
  REQUIRE(demo.rgb.cols >= 224);
  REQUIRE(demo.rgb.rows >= 224);
  const struct { const std::vector<int>* labels; int classes; } sets[3] = {
      {&demo.edge_class, kEdgeClasses}, {&demo.texture_class, kTextureClasses}, {&demo.colour_class, kColourClasses}};
  for (const auto& set : sets) {
    REQUIRE(set.labels->size() == static_cast<size_t>(demo.grid_h * demo.grid_w));
    for (int c = 0; c < set.classes; ++c) {
      INFO("class " << c);
      // Several patches per class, so a query always has other patches of its class to find.
      CHECK(std::count(set.labels->begin(), set.labels->end(), c) >= 8);
    }
  }
  // The labels are exclusive: no patch has more than one of the three properties.
  int mixed = 0;
  for (size_t p = 0; p < demo.edge_class.size(); ++p)
    mixed += (demo.edge_class[p] >= 0) + (demo.texture_class[p] >= 0) + (demo.colour_class[p] >= 0) > 1;
  CHECK(mixed == 0);
}

// Thresholds: the designed heads measure 0.979 / 0.816 / 0.890 / 0.883 (edges / texture / colour /
// position); the random control is near uniform, i.e. about the fraction of patches that match
// (0.003 to 0.163). The bounds leave room for small changes in the demo image but fail if a head
// stops doing its job or the control starts doing it.
TEST_CASE("each designed head attends to what its description says", "[bundled][heads]") {
  const Measured& m = measured();
  INFO(table("designed", m.designed) << table("random", m.random));
  const double minimum[kMeasures] = {0.9, 0.7, 0.8, 0.8};
  for (int h = 0; h < 4; ++h) {
    INFO("head " << h << ": " << kMeasureNames[h] << ", over " << m.designed.queries[h] << " query patches");
    REQUIRE(m.designed.queries[h] >= 50);
    CHECK(m.designed.share[h][h] >= minimum[h]);
    CHECK(m.random.share[h][h] <= m.designed.share[h][h] / 3.0);
  }
}

TEST_CASE("each designed head does its own job, not another head's", "[bundled][heads]") {
  // For every measure, the head designed for it scores far above the other heads: the heads are
  // separate, not four copies of one generally sharp head. Exception: the position head on the
  // class measures, since the demo's classes are regions and a patch's neighbours share its class.
  const Measured& m = measured();
  INFO(table("designed", m.designed));
  for (int measure = 0; measure < kMeasures; ++measure)
    for (int h = 0; h < 4; ++h) {
      if (h == measure || (h == kPositionHead && measure != kPositionHead)) continue;
      INFO("measure " << kMeasureNames[measure] << ", head " << h);
      CHECK(m.designed.share[h][measure] <= m.designed.share[measure][measure] / 3.0);
    }
}
