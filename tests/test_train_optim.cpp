// AdamW, clipping and the schedule against torch.optim.AdamW (foreach=False), clip_grad_norm_ and
// the same schedule in Python: tests/fixtures/make_grad_fixtures.py writes adamw.safetensors, six
// steps on fixed gradients (every other step clipped), two parameter groups (weight decay 0.05 on
// the weight matrices, none on the bias and pos_embed). Same gradients in -> the same parameters
// out after every step, to 1e-6 absolute (the values are O(1)).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "core/train/optimizer.hpp"
#include "models/safetensors.hpp"

using namespace vitlens;

TEST_CASE("train: AdamW + clipping + schedule match torch step by step", "[train][adamw]") {
  const SafetensorsFile file = read_safetensors(std::string(VITLENS_TEST_FIXTURES) + "/train/adamw.safetensors");
  const int steps = std::stoi(file.metadata.at("steps"));
  const int warmup = std::stoi(file.metadata.at("warmup"));
  const double base = std::stod(file.metadata.at("base_lr")), min_lr = std::stod(file.metadata.at("min_lr"));
  const auto decay_names = nlohmann::json::parse(file.metadata.at("decay")).get<std::set<std::string>>();

  train::ParamLayout layout;
  for (const auto& [key, tensor] : file.tensors) {
    if (key.rfind("init.", 0) != 0) continue;
    train::ParamEntry e;
    e.name = key.substr(5);
    e.shape = tensor.shape;
    e.size = tensor.values.size();
    e.offset = layout.total;
    e.decay = decay_names.count(e.name) > 0;
    layout.total += e.size;
    layout.entries.push_back(e);
  }
  REQUIRE(layout.entries.size() == 4);
  std::vector<float> params(layout.total), grads(layout.total);
  for (const auto& e : layout.entries) {
    const auto& v = file.tensors.at("init." + e.name).values;
    std::copy(v.begin(), v.end(), params.begin() + static_cast<std::ptrdiff_t>(e.offset));
  }
  train::AdamW adam;
  adam.weight_decay = 0.05;
  double worst = 0.0;
  for (int t = 0; t < steps; ++t) {
    for (const auto& e : layout.entries) {
      const auto& v = file.tensors.at("grad." + std::to_string(t) + "." + e.name).values;
      std::copy(v.begin(), v.end(), grads.begin() + static_cast<std::ptrdiff_t>(e.offset));
    }
    const double norm = train::clip_grad_norm(grads, 1.0);
    CHECK(std::abs(norm - file.tensors.at("grad_norm").values[static_cast<size_t>(t)]) < 1e-5 * norm);
    const double lr = train::scheduled_lr(base, min_lr, t, warmup, steps);
    CHECK(std::abs(lr - file.tensors.at("lr").values[static_cast<size_t>(t)]) < 1e-9);
    adam.update(layout, params.data(), grads.data(), lr);
    for (const auto& e : layout.entries) {
      const auto& ref = file.tensors.at("after." + std::to_string(t) + "." + e.name).values;
      for (size_t i = 0; i < e.size; ++i) {
        const double diff = std::abs(static_cast<double>(params[e.offset + i]) - ref[i]);
        worst = std::max(worst, diff);
        INFO("step " << t << " " << e.name << "[" << i << "]");
        REQUIRE(diff <= 1e-6);
      }
    }
  }
  std::printf("AdamW vs torch: %d steps, largest parameter difference %.2e\n", steps, worst);
  CHECK(adam.step == steps);
}

TEST_CASE("train: schedule warms up linearly, then decays by cosine to min_lr", "[train][adamw]") {
  CHECK(train::scheduled_lr(1.0, 0.0, 0, 4, 12) == Approx(0.25));
  CHECK(train::scheduled_lr(1.0, 0.0, 3, 4, 12) == Approx(1.0));
  CHECK(train::scheduled_lr(1.0, 0.0, 4, 4, 12) == Approx(1.0));
  CHECK(train::scheduled_lr(1.0, 0.0, 8, 4, 12) == Approx(0.5));
  CHECK(train::scheduled_lr(1.0, 0.1, 12, 4, 12) == Approx(0.1));
}
