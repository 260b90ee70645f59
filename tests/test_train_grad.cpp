// The hand-written backward passes against PyTorch autograd and against finite differences.
//
// PyTorch: tests/fixtures/make_grad_fixtures.py builds timm's VisionTransformer layout in float64
// (checked against timm's own class), runs one batch with a padding mask and label smoothing, and
// stores the weights, the batch, the loss and the gradient of every parameter and of the input.
// Here the float32 VitNet runs the same batch. Each tensor is compared in the max norm:
//   rel = max_i |g_i - ref_i| / max_i |ref_i|   must be <= 1e-4 (printed: the largest per case).
// Dropping one term of a backward moves some tensor by far more than that; measured by editing a
// copy of train_ops.cpp: without LayerNorm's mean(dxhat) term the largest difference is 0.90
// (grad_cls) and 1.16 (grad_avg), without the softmax's row-sum term 3.1 and 2.3.
//
// Finite differences: a tiny double-precision model (D = 8, 2 heads, depth 2, 2 x 2 grid), every
// parameter nudged by +-1e-6; central differences agree with backward to 1e-6 relative.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "models/model_io.hpp"
#include "models/safetensors.hpp"
#include "core/train/train_ops.hpp"
#include "core/train/vit_train.hpp"

using namespace vitlens;

namespace {

const std::string kTrainFixtures = std::string(VITLENS_TEST_FIXTURES) + "/train/";

using test::max_norm_rel;

void check_case(const std::string& name, KernelIsa isa) {
  const test::UseIsa use(isa);
  const SafetensorsFile file = read_safetensors(kTrainFixtures + name + ".safetensors");
  const VitConfig config = config_from_json(nlohmann::json::parse(file.metadata.at("config")), name);
  const int classes = std::stoi(file.metadata.at("num_classes"));
  const int batch = std::stoi(file.metadata.at("batch"));
  train::VitNet<float> net(config, classes);
  net.label_smoothing = std::stof(file.metadata.at("label_smoothing"));
  net.threads = 2;
  for (const train::ParamEntry& e : net.layout().entries) {
    const TensorData& t = file.tensors.at(e.name);
    REQUIRE(t.values.size() == e.size);
    std::copy(t.values.begin(), t.values.end(), net.params.begin() + static_cast<std::ptrdiff_t>(e.offset));
  }
  std::vector<int32_t> labels;
  for (float v : file.tensors.at("labels").values) labels.push_back(static_cast<int32_t>(v));
  std::vector<uint8_t> allowed;
  for (float v : file.tensors.at("key_allowed").values) allowed.push_back(v != 0.0f ? 1 : 0);
  REQUIRE(static_cast<int>(allowed.size()) == batch * net.tokens());
  const bool drop_path = file.tensors.count("drop_scale") > 0;
  if (drop_path) {
    net.drop_scale = file.tensors.at("drop_scale").values;  // (L, 2, B)
    REQUIRE(std::count(net.drop_scale.begin(), net.drop_scale.end(), 0.0f) > 0);  // some branch dropped
  } else {
    REQUIRE(std::count(allowed.begin(), allowed.end(), 0) > 0);  // the mask is really exercised
  }

  net.zero_grad();
  const float loss = net.forward(file.tensors.at("input").values.data(), labels.data(), allowed.data(), batch);
  net.backward(true);
  const float ref_loss = file.tensors.at("loss").values[0];
  CHECK(std::abs(loss - ref_loss) <= 1e-5f * std::abs(ref_loss));

  double worst = 0.0;
  std::string worst_name;
  auto compare = [&](const std::string& tensor, const float* got) {
    const double rel = max_norm_rel(got, file.tensors.at("grad." + tensor).values);
    INFO(name << ": gradient of " << tensor << " differs by " << rel << " (max-norm relative)");
    CHECK(rel <= 1e-4);
    if (rel > worst) worst = rel, worst_name = tensor;
  };
  for (const train::ParamEntry& e : net.layout().entries) compare(e.name, net.grads.data() + e.offset);
  compare("input", net.input_grad().data());
  std::printf("gradients vs PyTorch, %s (%s ops): loss %.7f (ref %.7f), %zu parameter tensors + input, largest max-norm "
              "relative difference %.2e (%s)\n",
              name.c_str(), train::train_ops_isa(), loss, ref_loss, net.layout().entries.size(), worst, worst_name.c_str());
}

// Central differences of the loss for every parameter (step 1e-6), against the gradients backward
// left in net.grads: {largest |numeric - backward|, largest |backward|}.
std::pair<double, double> finite_difference_gap(train::VitNet<double>& net, const std::vector<double>& images,
                                                const std::vector<int32_t>& labels, const uint8_t* allowed,
                                                int batch) {
  const std::vector<double> analytic = net.grads;
  const double h = 1e-6;
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < net.params.size(); ++i) {
    const double saved = net.params[i];
    net.params[i] = saved + h;
    const double up = net.forward(images.data(), labels.data(), allowed, batch);
    net.params[i] = saved - h;
    const double down = net.forward(images.data(), labels.data(), allowed, batch);
    net.params[i] = saved;
    const double numeric = (up - down) / (2 * h);
    worst = std::max(worst, std::abs(numeric - analytic[i]));
    scale = std::max(scale, std::abs(analytic[i]));
  }
  return {worst, scale};
}

}  // namespace

TEST_CASE("train: every gradient matches PyTorch autograd (class token, padding mask, label smoothing)",
          "[train][grad]") {
  for (KernelIsa isa : test::isas_here()) check_case("grad_cls", isa);  // the SSE2 build too, whatever the CPU
}

TEST_CASE("train: every gradient matches PyTorch autograd (mean pooling, no qkv bias, padding mask)",
          "[train][grad]") {
  for (KernelIsa isa : test::isas_here()) check_case("grad_avg", isa);
}

TEST_CASE("train: every gradient matches PyTorch autograd (drop path: timm's DropPath with fixed draws)",
          "[train][grad][droppath]") {
  for (KernelIsa isa : test::isas_here()) check_case("grad_droppath", isa);
}

TEST_CASE("train: the same gradients for 1 and 2 threads", "[train][grad]") {
  const SafetensorsFile file = read_safetensors(kTrainFixtures + "grad_cls.safetensors");
  const VitConfig config = config_from_json(nlohmann::json::parse(file.metadata.at("config")), "grad_cls");
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2}) {
    train::VitNet<float> net(config, 5);
    net.threads = threads;
    for (const train::ParamEntry& e : net.layout().entries) {
      const auto& v = file.tensors.at(e.name).values;
      std::copy(v.begin(), v.end(), net.params.begin() + static_cast<std::ptrdiff_t>(e.offset));
    }
    std::vector<int32_t> labels{0, 3, 1};
    net.zero_grad();
    net.forward(file.tensors.at("input").values.data(), labels.data(), nullptr, 3);
    net.backward();
    results.push_back(net.grads);
  }
  CHECK(results[0] == results[1]);
}

TEST_CASE("train: backward agrees with central finite differences in double", "[train][grad][fd]") {
  for (bool class_token : {true, false}) {
    VitConfig c;
    c.patch_size = 4;
    c.embed_dim = 8;
    c.num_heads = 2;
    c.depth = 2;
    c.img_h = c.img_w = 8;  // 2 x 2 grid
    c.mlp_ratio = 2.0;
    c.class_token = class_token;
    train::VitNet<double> net(c, 3);
    net.label_smoothing = 0.1;
    net.threads = 1;
    std::mt19937 rng(class_token ? 11 : 12);
    std::normal_distribution<double> normal(0.0, 0.5);
    for (double& p : net.params) p = normal(rng);
    const int batch = 2;
    std::vector<double> images(static_cast<size_t>(batch) * 3 * 8 * 8);
    for (double& v : images) v = normal(rng);
    const std::vector<int32_t> labels{2, 0};
    // The second image's last patch is padding: never a key.
    std::vector<uint8_t> allowed(static_cast<size_t>(batch * net.tokens()), 1);
    allowed.back() = 0;

    net.zero_grad();
    net.forward(images.data(), labels.data(), allowed.data(), batch);
    net.backward();
    const auto [worst, scale] = finite_difference_gap(net, images, labels, allowed.data(), batch);
    std::printf("finite differences (double, class_token %d): %zu parameters, largest |numeric - backward| %.2e "
                "of max |grad| %.2e\n",
                class_token ? 1 : 0, net.params.size(), worst, scale);
    CHECK(worst <= 1e-6 * scale);
  }
}

TEST_CASE("train: drop path's backward agrees with central finite differences in double", "[train][grad][fd][droppath]") {
  VitConfig c;
  c.patch_size = 4;
  c.embed_dim = 8;
  c.num_heads = 2;
  c.depth = 3;
  c.img_h = c.img_w = 8;
  c.mlp_ratio = 2.0;
  train::VitNet<double> net(c, 3);
  net.label_smoothing = 0.1;
  net.threads = 1;
  std::mt19937 rng(21);
  std::normal_distribution<double> normal(0.0, 0.5);
  for (double& p : net.params) p = normal(rng);
  const int batch = 3;
  std::vector<double> images(static_cast<size_t>(batch) * 3 * 8 * 8);
  for (double& v : images) v = normal(rng);
  const std::vector<int32_t> labels{2, 0, 1};
  // (L, 2, B): block 0 kept everywhere; block 1's attention dropped for image 0, its MLP kept at
  // 1 / (1 - 0.25); block 2 drops image 1's MLP and image 2's attention, the rest kept at 1 / 0.5.
  net.drop_scale = {1, 1, 1, 1, 1, 1,
                    0, 4.0 / 3, 4.0 / 3, 4.0 / 3, 4.0 / 3, 4.0 / 3,
                    2, 2, 0, 2, 0, 2};
  net.zero_grad();
  const double loss = net.forward(images.data(), labels.data(), nullptr, batch);
  net.backward();
  const auto [worst, scale] = finite_difference_gap(net, images, labels, nullptr, batch);
  std::printf("finite differences with drop path (double): %zu parameters, largest |numeric - backward| %.2e of max "
              "|grad| %.2e\n", net.params.size(), worst, scale);
  CHECK(worst <= 1e-6 * scale);
  // A dropped branch's weights get gradient only from the images that kept it: block 2's attention
  // and MLP are each dropped for one image, so their gradients differ from the undropped ones.
  train::VitNet<double> full(c, 3);
  full.params = net.params;
  full.label_smoothing = 0.1;
  full.threads = 1;
  full.zero_grad();
  const double full_loss = full.forward(images.data(), labels.data(), nullptr, batch);
  full.backward();
  CHECK(full_loss != loss);
  CHECK(full.grads != net.grads);
  // Scales of 1 everywhere are the plain residual, bit for bit (float, every build of the ops).
  for (KernelIsa isa : test::isas_here()) {
    const test::UseIsa use(isa);
    VitConfig cf = c;
    train::VitNet<float> a(cf, 3), b(cf, 3);
    for (size_t i = 0; i < a.params.size(); ++i) a.params[i] = b.params[i] = static_cast<float>(net.params[i]);
    std::vector<float> fimages(images.begin(), images.end());
    b.drop_scale.assign(static_cast<size_t>(2) * c.depth * batch, 1.0f);
    a.zero_grad();
    b.zero_grad();
    CHECK(a.forward(fimages.data(), labels.data(), nullptr, batch) == b.forward(fimages.data(), labels.data(), nullptr, batch));
    a.backward(true);
    b.backward(true);
    CHECK(a.grads == b.grads);
    CHECK(a.input_grad() == b.input_grad());
    // A scale table of the wrong size is refused in one line.
    b.drop_scale.assign(5, 1.0f);
    CHECK_THROWS_WITH(b.forward(fimages.data(), labels.data(), nullptr, batch), Catch::Contains("drop_scale holds 5"));
  }
}
