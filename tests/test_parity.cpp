// vitlens against PyTorch: every attention probability and the final tokens, to 1e-5.
//
// The expected values come from tests/fixtures/make_parity_fixtures.py, which builds timm's
// VisionTransformer layout in torch (float64, cast to float32), checks it against an independent
// numpy forward, and lists each case in tests/fixtures/parity/manifest.json: a model file, an
// 8-bit RGB PNG, the mask, probs (L, H, N, N) and output (N, D) as .npy. The images are fed at
// native size, so cases whose grid differs from the model's img_size exercise the bicubic
// resampling of pos_embed.
//
// Tolerance 1e-5 absolute. A float32 torch forward of the same cases lands within ~3e-6 of the
// files; a wrong LayerNorm eps (1e-6 vs 1e-5) or the tanh GELU moves them by > 1e-4.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/io/image.hpp"
#include "models/model_io.hpp"
#include "core/model/vit.hpp"
#include "npy_support.hpp"

namespace {

const std::string kParityDir = std::string(VITLENS_TEST_FIXTURES) + "/parity/";

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path + " (run tests/fixtures/make_parity_fixtures.py)");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

struct ParityCase {
  std::string name, model, image, probs, output;
  bool causal = false;
  int grid_h = 0, grid_w = 0, tokens = 0;
};

std::vector<ParityCase> parity_cases(double& tolerance) {
  const nlohmann::json manifest = nlohmann::json::parse(read_bytes(kParityDir + "manifest.json"));
  tolerance = manifest.at("tolerance").get<double>();
  std::vector<ParityCase> cases;
  for (const auto& j : manifest.at("cases")) {
    ParityCase c;
    c.name = j.at("name").get<std::string>();
    c.model = kParityDir + j.at("model").get<std::string>();
    c.image = kParityDir + j.at("image").get<std::string>();
    c.probs = kParityDir + j.at("probs").get<std::string>();
    c.output = kParityDir + j.at("output").get<std::string>();
    c.causal = j.at("causal").get<bool>();
    c.grid_h = j.at("grid").at(0).get<int>();
    c.grid_w = j.at("grid").at(1).get<int>();
    c.tokens = j.at("tokens").get<int>();
    cases.push_back(c);
  }
  return cases;
}

}  // namespace

TEST_CASE("npy reader reads float32 C-order arrays and rejects the rest", "[parity]") {
  // The reader is part of the oracle, so it is tested too.
  const std::vector<float> values = {1.0f, -2.5f, 3.25f, 0.0f, 1e-7f, 65504.0f};
  const NpyArray array =
      parse_npy(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", values), "ok");
  REQUIRE(array.shape == std::vector<int64_t>{2, 3});
  REQUIRE(array.values == values);

  using Catch::Contains;
  REQUIRE_THROWS_WITH(
      parse_npy(npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", values), "f8"),
      Contains("f8: descr"));
  REQUIRE_THROWS_WITH(
      parse_npy(npy_with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", values), "ft"),
      Contains("ft: fortran_order"));
  REQUIRE_THROWS_WITH(
      parse_npy(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (7,), }", values),
                "short"),
      Contains("short: 24 data bytes for 7"));
  REQUIRE_THROWS_WITH(parse_npy("PK\x03\x04 not npy at all", "zip"), Contains("zip: not a .npy file"));
}

TEST_CASE("forward matches PyTorch: attention probabilities and output", "[parity]") {
  double tolerance = 0.0;
  const std::vector<ParityCase> cases = parity_cases(tolerance);
  REQUIRE(cases.size() >= 6);  // the script writes six; fewer means the fixtures are stale
  REQUIRE(tolerance == Approx(1e-5));

  for (const ParityCase& c : cases) {
    SECTION(c.name) {
      INFO("case " << c.name << ": " << c.model << " on " << c.image << (c.causal ? ", causal" : ""));
      const vitlens::VitModel model = vitlens::load_model(c.model);
      const vitlens::VitConfig& config = model.config;
      const vitlens::PreparedImage image =
          vitlens::prepare_image(vitlens::load_image_rgb(c.image), config, 0 /* native size */);
      REQUIRE_FALSE(image.resized);
      REQUIRE(image.grid.grid_h == c.grid_h);
      REQUIRE(image.grid.grid_w == c.grid_w);

      vitlens::ForwardOptions options;
      options.keep_probs = true;
      options.causal = c.causal;
      const vitlens::ForwardResult result = vitlens::forward(model, image.grid, options);

      const NpyArray probs = read_npy(c.probs);    // (L, H, N, N)
      const NpyArray output = read_npy(c.output);  // (N, D)
      const int L = config.depth, H = config.num_heads, N = c.tokens, D = config.embed_dim;
      REQUIRE(probs.shape == std::vector<int64_t>{L, H, N, N});
      REQUIRE(output.shape == std::vector<int64_t>{N, D});
      REQUIRE(result.tokens == N);
      REQUIRE(result.prefix == config.prefix_tokens());
      REQUIRE(result.layers.size() == static_cast<size_t>(L));

      double worst_probs = 0.0, worst_row = 0.0, worst_received = 0.0, worst_cls = 0.0;
      for (int l = 0; l < L; ++l) {
        const vitlens::LayerState& layer = result.layers[static_cast<size_t>(l)];
        REQUIRE(layer.probs.size() == static_cast<size_t>(H));
        REQUIRE(layer.received.rows() == H);
        REQUIRE(layer.received.cols() == N);
        for (int h = 0; h < H; ++h) {
          INFO("layer " << l << " head " << h);
          const vitlens::MatRM& got = layer.probs[static_cast<size_t>(h)];
          REQUIRE(got.rows() == N);
          REQUIRE(got.cols() == N);
          const float* want = probs.values.data() + (static_cast<size_t>(l) * H + h) * N * N;
          const double diff = max_abs_diff(got.data(), want, static_cast<size_t>(N) * N);
          CHECK(diff <= tolerance);
          worst_probs = std::max(worst_probs, diff);

          // attention_row recomputes one query's row from q and the keys: same numbers.
          std::vector<float> row(static_cast<size_t>(N));
          for (int query : {0, 1, N / 2, N - 1}) {
            INFO("attention_row query " << query);
            vitlens::attention_row(model, result, l, h, query, row.data());
            const double row_diff = max_abs_diff(row.data(), want + static_cast<size_t>(query) * N, N);
            CHECK(row_diff <= tolerance);
            worst_row = std::max(worst_row, row_diff);
          }

          // Attention received: column means of the weights over all queries (no query row is
          // fully masked in these cases, causal included: a token always sees itself).
          REQUIRE(result.received_queries == N);
          std::vector<float> column_mean(static_cast<size_t>(N), 0.0f);
          for (int j = 0; j < N; ++j) {
            double sum = 0.0;
            for (int i = 0; i < N; ++i) sum += want[static_cast<size_t>(i) * N + j];
            column_mean[static_cast<size_t>(j)] = static_cast<float>(sum / N);
          }
          const vitlens::RowVecF received = layer.received.row(h);
          const double received_diff = max_abs_diff(received.data(), column_mean.data(), N);
          CHECK(received_diff <= tolerance);
          worst_received = std::max(worst_received, received_diff);

          if (config.class_token) {
            REQUIRE(layer.cls_row.rows() == H);
            REQUIRE(layer.cls_row.cols() == N);
            const vitlens::RowVecF cls_row = layer.cls_row.row(h);
            const double cls_diff = max_abs_diff(cls_row.data(), want, N);
            CHECK(cls_diff <= tolerance);
            worst_cls = std::max(worst_cls, cls_diff);
          } else {
            CHECK(layer.cls_row.size() == 0);
          }
        }
      }

      REQUIRE(result.output.rows() == N);
      REQUIRE(result.output.cols() == D);
      const double worst_output =
          max_abs_diff(result.output.data(), output.values.data(), static_cast<size_t>(N) * D);
      CHECK(worst_output <= tolerance);

      WARN(c.name << ": max |vitlens - torch| probs " << worst_probs << ", attention_row " << worst_row
                  << ", received " << worst_received << ", cls_row " << worst_cls << ", output "
                  << worst_output << " (tolerance " << tolerance << ")");
    }
  }
}

TEST_CASE("parity fixtures cover what they claim", "[parity]") {
  // Guards against a regenerated manifest silently dropping a kind of case.
  double tolerance = 0.0;
  bool causal = false, no_cls = false, resampled = false, imagenet = false;
  for (const ParityCase& c : parity_cases(tolerance)) {
    const vitlens::VitModel model = vitlens::load_model(c.model);
    causal |= c.causal;
    no_cls |= !model.config.class_token;
    resampled |= c.grid_h != model.config.grid_h() || c.grid_w != model.config.grid_w();
    imagenet |= model.config.mean[0] != 0.5f && model.config.norm_eps != 1e-6f;
  }
  CHECK(causal);
  CHECK(no_cls);
  CHECK(resampled);
  CHECK(imagenet);
}
