#pragma once
// Shared helpers for the tests: random models built in memory, temporary folders.
#include <cstdlib>
#include <string>

#include <unistd.h>

#include "vitlens/bundled.hpp"
#include "vitlens/model_io.hpp"

namespace vitlens::test {

// Every tensor of the config filled with N(0, scale^2) (LayerNorm weights around 1), seeded.
inline TensorMap random_tensors(const VitConfig& config, unsigned seed, float scale = 0.3f) {
  return gaussian_tensors(config, seed, scale);
}

inline VitModel random_model(const VitConfig& config, unsigned seed, float scale = 0.3f) {
  return model_from_tensors(config, random_tensors(config, seed, scale), "random-model");
}

inline VitConfig small_config(int img = 16, bool class_token = true, int depth = 1) {
  VitConfig c;
  c.name = "test";
  c.description = "random test model";
  c.patch_size = 4;
  c.embed_dim = 48;
  c.num_heads = 4;
  c.depth = depth;
  c.img_h = c.img_w = img;
  c.class_token = class_token;
  return c;
}

// A fresh empty folder under $TMPDIR (or /tmp), removed by the caller when wanted.
inline std::string temp_dir(const std::string& tag) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/vitlens-" + tag + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  return buf.data();
}

}  // namespace vitlens::test
