// The bundled models by name (bundled_models.hpp): the name is the file's, so the list is the
// folder's contents and the summaries are read from each file's own config and training record.
#include "models/bundled_models.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/base/error.hpp"
#include "models/json_file.hpp"
#include "models/model_io.hpp"
#include "models/safetensors.hpp"

namespace vitlens {

namespace {

constexpr const char* kPrefix = "vitlens-";
constexpr const char* kExtension = ".safetensors";

std::string names_list(const std::vector<BundledModelEntry>& models) {
  std::string names;
  for (const BundledModelEntry& m : models) names += (names.empty() ? "" : ", ") + m.name;
  return names.empty() ? "none found in " + bundled_models_dir() : names;
}

// The description's first clause ("Hand-designed, not trained: one block ..." -> "Hand-designed,
// not trained"): a one-line summary for a model without a training record.
std::string first_clause(const std::string& text) {
  const size_t end = text.find_first_of(":(.;");
  std::string clause = text.substr(0, end);
  while (!clause.empty() && clause.back() == ' ') clause.pop_back();
  return clause;
}

std::string format(const char* fmt, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, value);
  return buf;
}

}  // namespace

std::string bundled_models_dir() { return assets_dir() + "/models"; }

std::string bundled_model_name(const std::string& path) {
  const std::string file = std::filesystem::path(path).filename().string();
  const std::string prefix = kPrefix, extension = kExtension;
  if (file.size() <= prefix.size() + extension.size() || file.compare(0, prefix.size(), prefix) != 0 ||
      file.compare(file.size() - extension.size(), extension.size(), extension) != 0)
    return "";
  const std::string name = file.substr(prefix.size(), file.size() - prefix.size() - extension.size());
  // A training run's optimizer state (NAME.state.safetensors) is not a model.
  return name.find('.') == std::string::npos ? name : "";
}

std::vector<BundledModelEntry> list_bundled_models() {
  std::vector<BundledModelEntry> list;
  std::error_code ec;
  for (const auto& file : std::filesystem::directory_iterator(bundled_models_dir(), ec)) {
    BundledModelEntry m;
    m.name = bundled_model_name(file.path().string());
    if (m.name.empty()) continue;
    m.path = file.path().string();
    try {
      const SafetensorsFile st = read_safetensors(m.path);
      const auto config = st.metadata.find("config");
      if (config == st.metadata.end()) throw Error(m.path + ": no vitlens config in the file's metadata");
      m.config = config_from_json(parse_json_text(config->second, m.path + ": __metadata__[\"config\"]"), m.path);
      const auto training = st.metadata.find("training");
      if (training != st.metadata.end()) m.training = parse_json_text(training->second, m.path + ": the training record");
    } catch (const std::exception& e) {
      m.error = e.what();
    }
    list.push_back(std::move(m));
  }
  std::sort(list.begin(), list.end(), [](const BundledModelEntry& a, const BundledModelEntry& b) { return a.name < b.name; });
  return list;
}

std::string resolve_model(const std::string& name_or_path) {
  if (name_or_path.empty()) return default_model_path();
  std::error_code ec;
  if (name_or_path.find('/') != std::string::npos || std::filesystem::exists(name_or_path, ec)) return name_or_path;
  const std::vector<BundledModelEntry> models = list_bundled_models();
  for (const BundledModelEntry& m : models)
    if (m.name == name_or_path) return m.path;
  throw Error(name_or_path + ": cannot open a model file (no such file, and no bundled model has this name: " +
              names_list(models) + ")");
}

std::string bundled_model_summary(const BundledModelEntry& m) {
  if (!m.error.empty()) return "unreadable: " + m.error;
  const VitConfig& c = m.config;
  std::string line = "depth " + std::to_string(c.depth) + ", " + std::to_string(c.num_heads) + " heads, patch " +
                     std::to_string(c.patch_size) + ", " + std::to_string(c.img_w) + "x" + std::to_string(c.img_h) + "; ";
  const nlohmann::json& t = m.training;
  const auto number = [&](const char* key) { return t.contains(key) && t[key].is_number() ? t[key].get<double>() : -1.0; };
  const auto text = [&](const char* key) { return t.contains(key) && t[key].is_string() ? t[key].get<std::string>() : std::string(); };
  if (!t.is_object()) return line + first_clause(c.description);
  if (text("objective") == "mae") {
    line += "masked patch prediction (MAE) on " +
            (number("train_photos") > 0 ? format("%.0f", number("train_photos")) + " photos" : text("data"));
    if (number("val_loss") >= 0) line += ", validation loss " + format("%.3f", number("val_loss"));
    return line;
  }
  line += "classifier trained on " + text("data");
  if (number("num_classes") > 0) line += " (" + format("%.0f", number("num_classes")) + " classes)";
  if (number("test_accuracy") >= 0) return line + ", " + format("%.2f", 100.0 * number("test_accuracy")) + " % test accuracy";
  if (number("val_accuracy") >= 0)
    return line + ", " + format("%.2f", 100.0 * number("val_accuracy")) + " % validation accuracy";
  return line;
}

}  // namespace vitlens
