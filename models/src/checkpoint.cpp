// Training checkpoints: the model file through save_model, the optimizer state beside it.
#include "vitlens/checkpoint.hpp"

#include <cmath>
#include <sys/stat.h>

#include "vitlens/error.hpp"
#include "vitlens/safetensors.hpp"

namespace vitlens {

namespace {

constexpr const char* kStateFormat = "vitlens-train-state-1";

std::vector<float> gather(const train::ParamLayout& layout, const TensorMap& tensors, const std::string& prefix,
                          const std::string& what) {
  std::vector<float> out(layout.total);
  for (const train::ParamEntry& e : layout.entries) {
    const auto it = tensors.find(prefix + e.name);
    if (it == tensors.end()) throw Error(what + ": tensor '" + prefix + e.name + "' is missing");
    if (it->second.values.size() != e.size)
      throw Error(what + ": tensor '" + prefix + e.name + "' has " + std::to_string(it->second.values.size()) +
                  " values, expected " + std::to_string(e.size));
    std::copy(it->second.values.begin(), it->second.values.end(), out.begin() + static_cast<std::ptrdiff_t>(e.offset));
  }
  return out;
}

const std::string& meta(const SafetensorsFile& file, const std::string& key, const std::string& what) {
  const auto it = file.metadata.find(key);
  if (it == file.metadata.end()) throw Error(what + ": __metadata__ has no '" + key + "'");
  return it->second;
}

int64_t meta_int(const SafetensorsFile& file, const std::string& key, const std::string& what) {
  const std::string& text = meta(file, key, what);
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    return v;
  } catch (const std::exception&) {
    throw Error(what + ": __metadata__['" + key + "'] is not an integer");
  }
}

}  // namespace

std::string checkpoint_state_path(const std::string& model_path) {
  const std::string tail = ".safetensors";
  if (model_path.size() > tail.size() && model_path.compare(model_path.size() - tail.size(), tail.size(), tail) == 0)
    return model_path.substr(0, model_path.size() - tail.size()) + ".state.safetensors";
  return model_path + ".state.safetensors";
}

TensorMap layout_tensors(const train::ParamLayout& layout, const std::vector<float>& values) {
  TensorMap out;
  for (const train::ParamEntry& e : layout.entries) {
    TensorData t;
    t.shape = e.shape;
    t.values.assign(values.begin() + static_cast<std::ptrdiff_t>(e.offset),
                    values.begin() + static_cast<std::ptrdiff_t>(e.offset + e.size));
    out[e.name] = std::move(t);
  }
  return out;
}

namespace {

// The Adam moments, data order and position: what both objectives' state files share.
SafetensorsFile state_file(const train::ParamLayout& layout, const train::AdamW& adam, const TrainPosition& pos,
                           const Recipe& recipe) {
  SafetensorsFile state;
  for (const auto& [name, tensor] : layout_tensors(layout, adam.m)) state.tensors["adam_m." + name] = tensor;
  for (const auto& [name, tensor] : layout_tensors(layout, adam.v)) state.tensors["adam_v." + name] = tensor;
  TensorData order;
  order.shape = {static_cast<int64_t>(pos.order.size())};
  order.values.assign(pos.order.begin(), pos.order.end());
  state.tensors["data_order"] = std::move(order);
  state.metadata["format"] = kStateFormat;
  state.metadata["step"] = std::to_string(pos.step);
  state.metadata["epoch"] = std::to_string(pos.epoch);
  state.metadata["position"] = std::to_string(pos.position);
  state.metadata["adam_step"] = std::to_string(adam.step);
  for (int i = 0; i < 4; ++i) state.metadata["rng" + std::to_string(i)] = std::to_string(pos.rng[i]);
  state.metadata["recipe"] = recipe.to_json().dump();
  state.metadata["parameters"] = std::to_string(layout.total);
  return state;
}

void read_position(const SafetensorsFile& state, const std::string& state_path, int64_t step, TrainPosition& pos) {
  pos.step = step;
  pos.epoch = static_cast<int>(meta_int(state, "epoch", state_path));
  pos.position = meta_int(state, "position", state_path);
  for (int i = 0; i < 4; ++i) {
    const std::string& text = meta(state, "rng" + std::to_string(i), state_path);
    try {
      size_t used = 0;
      pos.rng[i] = std::stoull(text, &used);
      if (used != text.size()) throw std::invalid_argument(text);
    } catch (const std::exception&) {
      throw Error(state_path + ": __metadata__['rng" + std::to_string(i) + "'] is not an unsigned integer");
    }
  }
  const auto order = state.tensors.find("data_order");
  if (order == state.tensors.end()) throw Error(state_path + ": tensor 'data_order' is missing");
  for (float v : order->second.values) {
    if (!(v >= 0.0f) || v >= 16777216.0f || v != std::floor(v)) throw Error(state_path + ": tensor 'data_order' is corrupt");
    pos.order.push_back(static_cast<int32_t>(v));
  }
}

SafetensorsFile read_state(const std::string& model_path, std::string* state_path_out) {
  const std::string state_path = checkpoint_state_path(model_path);
  struct stat st {};
  if (::stat(state_path.c_str(), &st) != 0)
    throw Error(model_path + ": no training state beside it (" + state_path +
                "); only checkpoints written by 'vitlens train' can be resumed");
  SafetensorsFile state = read_safetensors(state_path);
  if (meta(state, "format", state_path) != kStateFormat)
    throw Error(state_path + ": not a vitlens training state (format '" + meta(state, "format", state_path) + "')");
  *state_path_out = state_path;
  return state;
}

}  // namespace

std::string checkpoint_objective(const std::string& model_path) {
  const SafetensorsFile model = read_safetensors(model_path);
  const auto it = model.metadata.find("training");
  if (it == model.metadata.end()) throw Error(model_path + ": not a 'vitlens train' checkpoint (no training record)");
  try {
    return nlohmann::json::parse(it->second).value("objective", std::string("classify"));
  } catch (const nlohmann::json::exception&) {
    throw Error(model_path + ": the training record is not valid JSON");
  }
}

void save_mae_checkpoint(const MaeTrainer& trainer, const std::string& model_path, nlohmann::json training) {
  const train::ParamLayout& layout = trainer.net().layout();
  const TrainPosition& pos = trainer.position();
  training["objective"] = "mae";
  training["step"] = pos.step;
  training["epoch"] = pos.epoch;
  training["recipe"] = trainer.recipe().to_json();
  training["mae"] = trainer.options().to_json();
  SafetensorsFile state = state_file(layout, trainer.optimizer(), pos, trainer.recipe());
  state.metadata["objective"] = "mae";
  state.metadata["mae"] = trainer.options().to_json().dump();
  state.metadata["num_classes"] = "0";
  // The encoder goes to the model file (timm names, no head: what view/export/info open); the
  // decoder (mask_token, decoder_*) only into the state, which resume reads and viewers never see.
  TensorMap encoder;
  for (auto& [name, tensor] : layout_tensors(layout, trainer.net().params)) {
    if (train::is_decoder_param(name)) state.tensors[name] = std::move(tensor);
    else encoder[name] = std::move(tensor);
  }
  write_safetensors(checkpoint_state_path(model_path), state);
  save_model(model_path, trainer.config(), encoder, {{"training", training.dump()}});
}

SavedMae load_mae_checkpoint(const std::string& model_path) {
  SavedMae saved;
  const SafetensorsFile model = read_safetensors(model_path);
  std::string state_path;
  const SafetensorsFile state = read_state(model_path, &state_path);
  const VitModel loaded = load_model(model_path);  // every check a viewer would do
  saved.config = loaded.config;
  try {
    saved.training = nlohmann::json::parse(meta(model, "training", model_path));
    saved.recipe = Recipe::from_json(nlohmann::json::parse(meta(state, "recipe", state_path)));
    saved.options = MaeOptions::from_json(nlohmann::json::parse(meta(state, "mae", state_path)));
  } catch (const nlohmann::json::exception&) {
    throw Error(model_path + ": the training record, recipe or MAE options are not valid JSON");
  }
  if (saved.training.value("objective", std::string()) != "mae" || meta(state, "objective", state_path) != "mae")
    throw Error(model_path + ": not an MAE checkpoint (objective is not 'mae')");
  const std::string why = saved.options.validate(saved.config);
  if (!why.empty()) throw Error(state_path + ": " + why);
  const int64_t step = meta_int(state, "step", state_path);
  if (!saved.training.contains("step") || !saved.training["step"].is_number_integer() ||
      saved.training["step"].get<int64_t>() != step)
    throw Error(model_path + ": the model and its state " + state_path +
                " come from different steps (an interrupted save?); resume from an earlier checkpoint");
  const train::ParamLayout layout = train::mae_param_layout(saved.config, saved.options.shape, nullptr);
  TensorMap both = model.tensors;
  for (const auto& [name, tensor] : state.tensors)
    if (train::is_decoder_param(name)) both[name] = tensor;
  saved.params = gather(layout, both, "", model_path + " + " + state_path);
  saved.adam_m = gather(layout, state.tensors, "adam_m.", state_path);
  saved.adam_v = gather(layout, state.tensors, "adam_v.", state_path);
  saved.adam_step = meta_int(state, "adam_step", state_path);
  read_position(state, state_path, step, saved.position);
  return saved;
}

void save_checkpoint(const Trainer& trainer, const std::string& model_path, nlohmann::json training) {
  const train::ParamLayout& layout = trainer.net().layout();
  const TrainPosition& pos = trainer.position();
  training["step"] = pos.step;
  training["epoch"] = pos.epoch;
  training["recipe"] = trainer.recipe().to_json();
  training["num_classes"] = trainer.num_classes();

  SafetensorsFile state = state_file(layout, trainer.optimizer(), pos, trainer.recipe());
  state.metadata["num_classes"] = std::to_string(trainer.num_classes());
  // State first, model second: a crash in between leaves a new state beside an old model, which
  // load_checkpoint refuses (different steps) instead of silently mixing them.
  write_safetensors(checkpoint_state_path(model_path), state);
  save_model(model_path, trainer.config(), layout_tensors(layout, trainer.net().params),
             {{"training", training.dump()}});
}

SavedTraining load_checkpoint(const std::string& model_path) {
  SavedTraining saved;
  const SafetensorsFile model = read_safetensors(model_path);
  std::string state_path;
  const SafetensorsFile state = read_state(model_path, &state_path);
  const VitModel loaded = load_model(model_path);  // every check a viewer would do
  saved.config = loaded.config;
  nlohmann::json training;
  try {
    training = nlohmann::json::parse(meta(model, "training", model_path));
    saved.recipe = Recipe::from_json(nlohmann::json::parse(meta(state, "recipe", state_path)));
  } catch (const nlohmann::json::exception&) {
    throw Error(model_path + ": the training record or recipe is not valid JSON");
  }
  if (training.value("objective", std::string("classify")) != "classify")
    throw Error(model_path + ": a '" + training.value("objective", std::string()) +
                "' checkpoint, not a classifier's (resume it with the same --data)");
  saved.training = training;
  saved.num_classes = static_cast<int>(meta_int(state, "num_classes", state_path));
  if (saved.num_classes != loaded.w.num_classes)
    throw Error(state_path + ": state is for " + std::to_string(saved.num_classes) + " classes, the model has " +
                std::to_string(loaded.w.num_classes));
  const int64_t step = meta_int(state, "step", state_path);
  if (!training.contains("step") || !training["step"].is_number_integer() || training["step"].get<int64_t>() != step)
    throw Error(model_path + ": the model and its state " + state_path +
                " come from different steps (an interrupted save?); resume from an earlier checkpoint");
  const train::ParamLayout layout = train::param_layout(saved.config, saved.num_classes);
  saved.params = gather(layout, model.tensors, "", model_path);
  saved.adam_m = gather(layout, state.tensors, "adam_m.", state_path);
  saved.adam_v = gather(layout, state.tensors, "adam_v.", state_path);
  saved.adam_step = meta_int(state, "adam_step", state_path);
  read_position(state, state_path, step, saved.position);
  return saved;
}

}  // namespace vitlens
