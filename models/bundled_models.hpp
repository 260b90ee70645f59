#pragma once
// The bundled models by name. Every file assets/models/vitlens-NAME.safetensors is the bundled
// model NAME (designed, random, fashion-mnist, mae-photos today), so a model added to the folder
// gets a name without code changes. Wherever a model is taken (`--model`, the viewer's Model
// menu), a name or a path works:
//   ""                      the bundled designed model
//   contains '/' or exists  that file, even when a bundled model has the same name
//   a bundled name          assets_dir()/models/vitlens-NAME.safetensors
//   anything else           Error: no such file, and the bundled names
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/vit.hpp"

namespace vitlens {

struct BundledModelEntry {
  std::string name;      // "designed"
  std::string path;      // assets_dir()/models/vitlens-designed.safetensors
  VitConfig config;      // from the file's header
  nlohmann::json training;  // the file's __metadata__["training"], null for a model not trained
  std::string error;     // non-empty: the file is there but its header could not be read
};

std::string bundled_models_dir();  // assets_dir()/models
// Every vitlens-*.safetensors in bundled_models_dir(), sorted by name; reads only the headers.
std::vector<BundledModelEntry> list_bundled_models();
// "designed" for .../vitlens-designed.safetensors, "" for a file not named like a bundled model.
std::string bundled_model_name(const std::string& path);
// The model file `name_or_path` means (the rules above); throws vitlens::Error with one line.
std::string resolve_model(const std::string& name_or_path);
// One line for `vitlens models`: shape, what the model learned and how well it measured.
std::string bundled_model_summary(const BundledModelEntry& entry);

}  // namespace vitlens
