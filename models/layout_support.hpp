#pragma once
// What the layout files share (published_layouts.cpp, timm_layout.cpp, hf_layout.cpp), private to
// models/: JSON readers that name the file in their errors, the Tensors taker, q/k/v stacking,
// the standard normalisations, and the two converters convert_checkpoint chooses between.
#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "models/json_file.hpp"
#include "models/published_layouts.hpp"

namespace vitlens {
namespace layout_support {

using nlohmann::json;

// [SECTION] Small helpers

inline bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

inline bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A companion file's strings are names (architecture, model_type, hidden_act, _name_or_path,
// labels): each is cut to a model name's length as it is read, so none of megabytes travels on.
inline json read_json(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(what + ": cannot read its companion file " + path);
  std::ostringstream text;
  text << in.rdbuf();
  json j = parse_json_text(text.str(), what + ": companion file " + path, kMaxModelNameBytes);
  if (!j.is_object()) throw Error(what + ": companion file " + path + " is not a JSON object");
  return j;
}

inline int json_int(const json& j, const char* key, const std::string& what, const std::string& file) {
  if (!j.contains(key)) throw Error(what + ": " + file + " has no '" + key + "'");
  const json& v = j.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1000000)
    throw Error(what + ": " + file + " key '" + key + "' is not a non-negative integer");
  return static_cast<int>(v.get<int64_t>());
}

inline double json_number(const json& j, const char* key, double fallback, const std::string& what, const std::string& file) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  if (!j.at(key).is_number()) throw Error(what + ": " + file + " key '" + key + "' is not a number");
  return j.at(key).get<double>();
}

inline bool json_bool(const json& j, const char* key, bool fallback, const std::string& what, const std::string& file) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  if (!j.at(key).is_boolean()) throw Error(what + ": " + file + " key '" + key + "' is not true or false");
  return j.at(key).get<bool>();
}

inline bool json_rgb(const json& j, const char* key, std::array<float, 3>& out) {
  if (!j.contains(key)) return false;
  const json& v = j.at(key);
  if (!v.is_array() || v.size() != 3) return false;
  for (size_t c = 0; c < 3; ++c) {
    if (!v[c].is_number()) return false;
    out[c] = v[c].get<float>();
  }
  return true;
}

// Takes tensors out of a checkpoint by name; what is left at the end was not mapped.
struct Tensors {
  TensorMap map;
  std::string what;

  bool has(const std::string& name) const { return map.count(name) != 0; }
  const TensorData& peek(const std::string& name) const {
    const auto it = map.find(name);
    if (it == map.end()) throw Error(what + ": tensor '" + name + "' is missing");
    return it->second;
  }
  // Checked for NaN here, so a renamed tensor is named as the file names it.
  TensorData take(const std::string& name) {
    const auto it = map.find(name);
    if (it == map.end()) throw Error(what + ": tensor '" + name + "' is missing");
    for (float v : it->second.values)
      if (!std::isfinite(v)) throw Error(what + ": tensor '" + name + "' holds NaN or infinite values");
    TensorData t = std::move(it->second);
    map.erase(it);
    return t;
  }
  // Takes `name` and checks its element count against `shape`, which it then gets (a reshape).
  TensorData take_as(const std::string& name, const std::vector<int64_t>& shape) {
    TensorData t = take(name);
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    if (t.values.size() != n)
      throw Error(what + ": tensor '" + name + "' has shape " + shape_text(t.shape) + ", expected " + shape_text(shape));
    t.shape = shape;
    return t;
  }
  // Drops every tensor whose name starts with `prefix`; true when any was there.
  bool drop_prefix(const std::string& prefix) {
    bool any = false;
    for (auto it = map.begin(); it != map.end();)
      if (starts_with(it->first, prefix)) {
        it = map.erase(it);
        any = true;
      } else {
        ++it;
      }
    return any;
  }
  // Strips `prefix` from every name that has it (e.g. "vit." of ViTForImageClassification).
  void strip_prefix(const std::string& prefix) {
    TensorMap out;
    for (auto& entry : map)
      out.emplace(starts_with(entry.first, prefix) ? entry.first.substr(prefix.size()) : entry.first, std::move(entry.second));
    map = std::move(out);
  }
};

// (out, in) rows of q, k and v stacked into timm's fused (3 out, in): rows [Q heads | K heads | V heads].
inline TensorData stack_rows(const std::vector<TensorData>& parts) {
  TensorData out;
  out.shape = parts[0].shape;
  out.shape[0] = 0;
  for (const TensorData& p : parts) {
    out.shape[0] += p.shape[0];
    out.values.insert(out.values.end(), p.values.begin(), p.values.end());
  }
  return out;
}

// mlp_ratio so that int(D * ratio) == hidden, as timm computes the MLP width in double. A width
// D below 1 has none: 0, which the config's own checks refuse with the width named.
inline double mlp_ratio_for(int dim, int hidden) {
  if (dim < 1 || hidden < 0) return 0.0;
  double ratio = static_cast<double>(hidden) / dim;
  while (static_cast<int>(dim * ratio) < hidden) ratio = std::nextafter(ratio, 1e9);
  return ratio;
}

inline const std::array<float, 3> kImagenetMean{0.485f, 0.456f, 0.406f}, kImagenetStd{0.229f, 0.224f, 0.225f};
inline const std::array<float, 3> kClipMean{0.48145466f, 0.4578275f, 0.40821073f}, kClipStd{0.26862954f, 0.26130258f, 0.27577711f};

// Patch grid of a positional table with `rows` patch rows, for a square image: 0 when not a square.
inline int square_side(int64_t rows) {
  if (rows < 1) return 0;
  const auto side = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(rows))));
  return side * side == rows ? static_cast<int>(side) : 0;
}

// The patch embedding's (D, 3, P, P): D and P, or a one-line error.
inline void read_patch_embed(const TensorData& w, const std::string& name, const std::string& what, int& dim, int& patch) {
  if (w.shape.size() != 4 || w.shape[2] != w.shape[3] || w.shape[0] < 1 || w.shape[2] < 1)
    throw Error(what + ": tensor '" + name + "' has shape " + shape_text(w.shape) + ", expected [D, 3, P, P]");
  if (w.shape[1] != 3)
    throw Error(what + ": tensor '" + name + "' takes " + std::to_string(w.shape[1]) +
                " input channels; vitlens feeds RGB images (3 channels)");
  dim = static_cast<int>(w.shape[0]);
  patch = static_cast<int>(w.shape[2]);
}

}  // namespace layout_support

// timm's hub layout (timm_layout.cpp) and transformers' save_pretrained layout (hf_layout.cpp).
ConvertedModel convert_timm(layout_support::Tensors t, const std::string& folder, const LoadOptions& options);
ConvertedModel convert_hf(layout_support::Tensors t, const std::string& folder, const LoadOptions& options);

}  // namespace vitlens
