// Training checkpoints: the model file (save_model's bytes) and the optimizer state beside it,
// replaced together as one FileGroup (files.hpp). Resume first completes a save that was cut short
// after its commit point, then reads both files and checks the state as strictly as load_model
// checks the weights: a state Adam or the trainers could not have left is refused, naming the
// file and the field.
//
// Index
//   [SECTION] Reading tensors and metadata
//   [SECTION] Checks of the optimizer state
//   [SECTION] Writing a checkpoint
//   [SECTION] Reading a checkpoint
#include "models/training_checkpoint.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <sys/stat.h>

#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "core/io/paths.hpp"
#include "models/json_file.hpp"
#include "models/safetensors.hpp"

namespace vitlens {

namespace {

constexpr const char* kStateFormat = "vitlens-train-state-1";
constexpr const char* kDamaged = "; the training state is damaged";

// =============================================================================================
// [SECTION] Reading tensors and metadata
// =============================================================================================
// The layout's tensors `prefix + name` as one buffer; every value must be finite (load_model
// refuses NaN and infinities in weights: moments and decoder weights get the same check).
std::vector<float> gather(const train::ParamLayout& layout, const TensorMap& tensors, const std::string& prefix,
                          const std::string& what) {
  std::vector<float> out(layout.total);
  for (const train::ParamEntry& e : layout.entries) {
    const auto it = tensors.find(prefix + e.name);
    if (it == tensors.end()) throw Error(what + ": tensor '" + prefix + e.name + "' is missing");
    const std::vector<float>& values = it->second.values;
    if (values.size() != e.size)
      throw Error(what + ": tensor '" + prefix + e.name + "' has " + std::to_string(values.size()) +
                  " values, expected " + std::to_string(e.size));
    for (size_t i = 0; i < values.size(); ++i)
      if (!std::isfinite(values[i]))
        throw Error(what + ": tensor '" + prefix + e.name + "' holds " + (std::isnan(values[i]) ? "NaN" : "an infinity") +
                    " at entry " + std::to_string(i) + kDamaged);
    std::copy(values.begin(), values.end(), out.begin() + static_cast<std::ptrdiff_t>(e.offset));
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

// An integer in [lo, hi], or an error naming the field.
int64_t meta_int_in(const SafetensorsFile& file, const std::string& key, int64_t lo, int64_t hi, const std::string& what) {
  const int64_t v = meta_int(file, key, what);
  if (v < lo || v > hi)
    throw Error(what + ": __metadata__['" + key + "'] is " + std::to_string(v) + ", outside [" + std::to_string(lo) +
                ", " + std::to_string(hi) + "]" + kDamaged);
  return v;
}

// =============================================================================================
// [SECTION] Checks of the optimizer state
// =============================================================================================
// Adam's moments as AdamW::update (optimizer.hpp) can leave them, from any gradients:
//   v = (1 - b2) sum_k b2^k g_k^2 >= 0, and m = (1 - b1) sum_k b1^k g_k, so by Cauchy-Schwarz
//   m^2 <= c^2 v with c^2 = (1 - b1)^2 / ((1 - b2)(1 - b1^2 / b2))   (c = 7.27 for 0.9, 0.999);
//   with gradients clipped to norm C (clip_grad_norm), also |m| <= C and v <= C^2.
// The margins cover float rounding (relative 1%) and moments of gradients so small that their
// squares underflow (absolute 1e-12). A larger m is what made a damaged state train into "the
// loss is not finite".
void check_moments(const train::ParamLayout& layout, const std::vector<float>& m, const std::vector<float>& v,
                   const Recipe& recipe, const std::string& state_path) {
  const double b1 = recipe.beta1, b2 = recipe.beta2;
  const bool ratio_bounded = b1 * b1 < b2;  // otherwise the sum above grows without bound
  const double c = ratio_bounded ? std::sqrt((1 - b1) * (1 - b1) / ((1 - b2) * (1 - b1 * b1 / b2))) * 1.01 : 0.0;
  const double clip = recipe.clip_norm > 0.0 ? recipe.clip_norm * 1.01 : 0.0;
  std::ostringstream clip_text;
  clip_text << recipe.clip_norm;
  for (const train::ParamEntry& e : layout.entries)
    for (size_t i = 0; i < e.size; ++i) {
      const double mi = m[e.offset + i], vi = v[e.offset + i];
      auto refuse = [&](const std::string& name, double value, const std::string& why) {
        std::ostringstream text;
        text << state_path << ": tensor '" << name << e.name << "' holds " << value << " at entry " << i << ", " << why
             << kDamaged;
        throw Error(text.str());
      };
      if (vi < 0.0) refuse("adam_v.", vi, "but Adam's second moment is never negative");
      if (clip > 0.0 && vi > clip * clip)
        refuse("adam_v.", vi, "above the square of the gradient clipping norm " + clip_text.str());
      if (clip > 0.0 && std::fabs(mi) > clip)
        refuse("adam_m.", mi, "beyond the gradient clipping norm " + clip_text.str());
      if (ratio_bounded && std::fabs(mi) > c * std::sqrt(vi) + 1e-12) {
        std::ostringstream why;
        why << "more than Adam's first moment can be beside its second moment " << vi << " (at most " << c / 1.01
            << " sqrt(adam_v))";
        refuse("adam_m.", mi, why.str());
      }
    }
}

// The position as Trainer::step leaves it at a step boundary: one
// Adam update per step; a data Rng that is not all zero (xoshiro's one state it never leaves or
// reaches); the epoch's order a shuffle of `copies` copies of 0..n-1 (the classifier's images once,
// MAE's photos crops_per_photo times); and step = epoch * steps_per_epoch + position, or, at the end
// of the last epoch, position = steps_per_epoch and step = epoch * steps_per_epoch.
void check_position(const TrainPosition& pos, int64_t adam_step, const Recipe& recipe, int copies,
                    const std::string& state_path) {
  if (adam_step != pos.step)
    throw Error(state_path + ": __metadata__['adam_step'] is " + std::to_string(adam_step) + ", but the state is at step " +
                std::to_string(pos.step) + " and every step makes one Adam update" + kDamaged);
  if (pos.rng[0] == 0 && pos.rng[1] == 0 && pos.rng[2] == 0 && pos.rng[3] == 0)
    throw Error(state_path + ": __metadata__['rng0'] to ['rng3'] are all zero, a state the data Rng never has" + kDamaged);
  const size_t n = pos.order.size();
  if (copies < 1 || n % static_cast<size_t>(copies) != 0)
    throw Error(state_path + ": tensor 'data_order' has " + std::to_string(n) + " entries, not a multiple of the " +
                std::to_string(copies) + " crops per photo" + kDamaged);
  const size_t distinct = n / static_cast<size_t>(copies);
  std::vector<int> seen(distinct, 0);
  for (size_t i = 0; i < n; ++i) {
    const int32_t k = pos.order[i];
    if (k < 0 || static_cast<size_t>(k) >= distinct)
      throw Error(state_path + ": tensor 'data_order' entry " + std::to_string(i) + " is " + std::to_string(k) +
                  ", outside [0, " + std::to_string(distinct) + ")" + kDamaged);
    if (++seen[static_cast<size_t>(k)] > copies)
      throw Error(state_path + ": tensor 'data_order' holds " + std::to_string(k) + " more than " +
                  (copies == 1 ? std::string("once") : std::to_string(copies) + " times") + " (entry " +
                  std::to_string(i) + "), not a shuffle" + kDamaged);
  }
  const int64_t per_epoch = recipe.batch > 0 ? static_cast<int64_t>(n) / recipe.batch : 0;
  const bool mid_run = pos.position >= 0 && pos.position <= per_epoch && pos.step == pos.epoch * per_epoch + pos.position;
  const bool run_end = pos.position == per_epoch && pos.step == pos.epoch * per_epoch;
  if (!mid_run && !run_end)
    throw Error(state_path + ": __metadata__ step " + std::to_string(pos.step) + ", epoch " + std::to_string(pos.epoch) +
                " and position " + std::to_string(pos.position) + " do not fit " + std::to_string(per_epoch) +
                " steps per epoch" + kDamaged);
}

// =============================================================================================
// [SECTION] Writing a checkpoint
// =============================================================================================
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

// A file at one of a checkpoint's names may be replaced only when vitlens wrote it as such: a
// model file with a training record, a state file in vitlens' state format. Anything else (a
// user's photo or model picked in a save dialog, a folder) is refused before anything is written.
// Returns false for a name nothing has.
bool require_replaceable_checkpoint_file(const std::string& path, bool state) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return false;  // a new name
  const std::string refuse = path + ": exists and is not a vitlens training checkpoint" +
                             std::string(state ? " state" : "") +
                             "; vitlens replaces no file it did not write: choose another name (nothing was saved)";
  if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) throw Error(refuse);
  std::map<std::string, std::string> metadata;
  try {
    metadata = read_safetensors_metadata(path);
  } catch (const Error&) {
    throw Error(refuse);
  }
  const bool ours = state ? metadata.count("format") && metadata.at("format") == kStateFormat : metadata.count("training") > 0;
  if (!ours) throw Error(refuse);
  return true;
}

// Both objectives' save: the model file and the state, replaced together. The error says what
// is on disk afterwards.
void write_checkpoint(const std::string& model_path, const VitConfig& config, const TensorMap& model_tensors,
                      const nlohmann::json& training, const SafetensorsFile& state, int64_t step) {
  const bool model_exists = require_replaceable_checkpoint_file(model_path, false);
  const bool state_exists = require_replaceable_checkpoint_file(checkpoint_state_path(model_path), true);
  const std::string model_bytes = model_file_bytes(model_path, config, model_tensors, {{"training", training.dump()}});
  const std::string state_bytes = safetensors_bytes(state);
  bool committed = false;
  try {
    // Two new names stay new: whatever takes one of them between this check and the commit (a
    // user's file, another program's) is kept and the save refused, never replaced.
    FileGroup group(parent_dir(model_path), !model_exists && !state_exists);
    for (const auto& file : {std::pair<std::string, const std::string*>{model_path, &model_bytes},
                             {checkpoint_state_path(model_path), &state_bytes}}) {
      const std::string& bytes = *file.second;
      group.add_stream(base_name(file.first), [&](FileSink& sink) { sink.write(bytes.data(), bytes.size()); });
    }
    try {
      group.commit();
    } catch (const Error&) {
      committed = group.committed();
      throw;
    }
  } catch (const Error& e) {
    const std::string which = "the checkpoint of step " + std::to_string(step);
    if (committed)
      throw Error(std::string(e.what()) + "; " + which + " is saved whole and the next save or --resume of " +
                  model_path + " puts it in place");
    throw Error(std::string(e.what()) + "; " + which + " was not saved, the last one saved is kept");
  }
}

// =============================================================================================
// [SECTION] Reading a checkpoint
// =============================================================================================
// What both loaders read: the model file (its metadata and the model load_model makes of it) and
// the state file, from disk or from memory.
struct CheckpointFiles {
  std::string model_path, state_path;
  SafetensorsFile model, state;
  VitConfig config;     // as load_model reads it, with every check a viewer does
  int num_classes = 0;  // of the model's head (0: none)
};

void check_state_format(const CheckpointFiles& f) {
  if (meta(f.state, "format", f.state_path) != kStateFormat)
    throw Error(f.state_path + ": not a vitlens training state (format '" + meta(f.state, "format", f.state_path) + "')");
}

// Completes a save of the checkpoint's folder cut short after its commit point (FileGroup) and
// removes our stale temporaries there: the newest whole pair is then in place.
void complete_interrupted_save(const std::string& model_path) {
  const std::string dir = parent_dir(model_path);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;  // reading the file says what is wrong
  try {
    tidy_output_dir(dir);
  } catch (const Error& e) {
    throw Error(model_path + ": cannot complete an interrupted save in its folder: " + e.what());
  }
}

CheckpointFiles read_checkpoint_files(const std::string& model_path) {
  complete_interrupted_save(model_path);
  struct stat st {};
  CheckpointFiles f;
  f.model_path = model_path;
  f.state_path = checkpoint_state_path(model_path);
  f.model = read_safetensors(model_path);
  if (::stat(f.state_path.c_str(), &st) != 0)
    throw Error(model_path + ": no training state beside it (" + f.state_path +
                "); only checkpoints written by 'vitlens train' can be resumed");
  f.state = read_safetensors(f.state_path);
  check_state_format(f);
  const VitModel loaded = load_model(model_path);
  f.config = loaded.config;
  f.num_classes = loaded.w.num_classes;
  return f;
}

CheckpointFiles parse_checkpoint_files(const std::string& model_bytes, const std::string& state_bytes,
                                       const std::string& model_what) {
  CheckpointFiles f;
  f.model_path = model_what;
  f.state_path = checkpoint_state_path(model_what);
  f.model = parse_safetensors(model_bytes, f.model_path);
  f.state = parse_safetensors(state_bytes, f.state_path);
  check_state_format(f);
  const VitModel loaded = parse_model(model_bytes, model_what);
  f.config = loaded.config;
  f.num_classes = loaded.w.num_classes;
  return f;
}

// The state's step against the model's training record: equal in any pair one save wrote.
int64_t paired_step(const CheckpointFiles& f, const nlohmann::json& training) {
  const int64_t step = meta_int_in(f.state, "step", 0, INT64_MAX, f.state_path);
  if (!training.contains("step") || !training["step"].is_number_integer() || training["step"].get<int64_t>() != step)
    throw Error(f.model_path + ": the model (step " +
                (training.contains("step") ? training["step"].dump() : std::string("unknown")) + ") and its state " +
                f.state_path + " (step " + std::to_string(step) +
                ") come from different steps: they were not saved together, so this pair cannot be resumed");
  return step;
}

// The moments, Adam step and position in the state, checked (see the checks above); `copies` is
// how often each index appears in the data order.
void read_optimizer_state(const CheckpointFiles& f, const train::ParamLayout& layout, const Recipe& recipe,
                          int64_t step, int copies, std::vector<float>& adam_m, std::vector<float>& adam_v,
                          int64_t& adam_step, TrainPosition& pos) {
  const std::string& path = f.state_path;
  const std::string why = recipe.validate();
  if (!why.empty()) throw Error(path + ": __metadata__['recipe']: " + why);
  adam_m = gather(layout, f.state.tensors, "adam_m.", path);
  adam_v = gather(layout, f.state.tensors, "adam_v.", path);
  check_moments(layout, adam_m, adam_v, recipe, path);
  adam_step = meta_int(f.state, "adam_step", path);
  pos.step = step;
  pos.epoch = static_cast<int>(meta_int_in(f.state, "epoch", 0, INT_MAX, path));
  pos.position = meta_int_in(f.state, "position", 0, INT64_MAX, path);
  for (int i = 0; i < 4; ++i) {
    const std::string key = "rng" + std::to_string(i);
    const std::string& text = meta(f.state, key, path);
    try {
      size_t used = 0;
      if (text.empty() || text[0] == '-') throw std::invalid_argument(text);
      pos.rng[i] = std::stoull(text, &used);
      if (used != text.size()) throw std::invalid_argument(text);
    } catch (const std::exception&) {
      throw Error(path + ": __metadata__['" + key + "'] is not an unsigned 64-bit integer" + kDamaged);
    }
  }
  const auto order = f.state.tensors.find("data_order");
  if (order == f.state.tensors.end()) throw Error(path + ": tensor 'data_order' is missing");
  pos.order.clear();
  for (size_t i = 0; i < order->second.values.size(); ++i) {
    const float v = order->second.values[i];
    if (!(v >= 0.0f) || v >= 16777216.0f || v != std::floor(v))
      throw Error(path + ": tensor 'data_order' entry " + std::to_string(i) + " is not an index" + kDamaged);
    pos.order.push_back(static_cast<int32_t>(v));
  }
  check_position(pos, adam_step, recipe, copies, path);
}

nlohmann::json training_record(const CheckpointFiles& f) {
  return parse_json_text(meta(f.model, "training", f.model_path), f.model_path + ": the training record");
}

Recipe recipe_of(const CheckpointFiles& f) {
  try {
    return Recipe::from_json(parse_json_text(meta(f.state, "recipe", f.state_path), f.state_path + ": __metadata__['recipe']"));
  } catch (const nlohmann::json::exception&) {
    throw Error(f.state_path + ": __metadata__['recipe'] is not a valid recipe");
  }
}

// The objective a pair was saved for: the model's record's tag (older classifier files have none)
// and the state's, which one save writes alike.
const ObjectiveKind& objective_of(const CheckpointFiles& f, const nlohmann::json& training, const std::string& expected) {
  const auto tag = [](const nlohmann::json& value) { return value.is_string() ? value.get<std::string>() : value.dump(); };
  const std::string name = training.contains("objective") ? tag(training["objective"]) : "classify";
  const auto state_tag = f.state.metadata.find("objective");
  const std::string state_name = state_tag == f.state.metadata.end() ? "classify" : state_tag->second;
  if (!expected.empty() && name != expected)
    throw Error(f.model_path + ": a '" + name + "' checkpoint, not a '" + expected +
                "' one (resume it with the same --data)");
  if (state_name != name)
    throw Error(f.model_path + ": the model's objective '" + name + "' and its state's '" + state_name +
                "' differ: they were not saved together, so this pair cannot be resumed");
  const ObjectiveKind* kind = find_objective_kind(name);
  if (!kind) throw Error(f.model_path + ": trained with the objective '" + name + "', which this vitlens does not know");
  return *kind;
}

// The objective's options as its state records them, checked against the model.
nlohmann::json objective_options(const CheckpointFiles& f, const ObjectiveKind& kind) {
  const std::string key = kind.options_key;
  nlohmann::json options;
  try {
    options = parse_json_text(meta(f.state, key, f.state_path), f.state_path + ": __metadata__['" + key + "']");
  } catch (const Error& e) {
    throw Error(e.what() + std::string(kDamaged));
  }
  const std::string why = kind.check(f.config, options);
  if (!why.empty()) throw Error(f.state_path + ": " + why);
  const int classes = kind.head_classes(options);
  if (classes != f.num_classes)
    throw Error(f.state_path + ": state is for " + std::to_string(classes) + " classes, the model has " +
                std::to_string(f.num_classes));
  return options;
}

SavedTraining saved_from(const CheckpointFiles& f, const std::string& expected) {
  SavedTraining saved;
  saved.config = f.config;
  saved.num_classes = f.num_classes;
  saved.training = training_record(f);
  if (!saved.training.is_object()) throw Error(f.model_path + ": the training record is not a JSON object");
  saved.recipe = recipe_of(f);
  const ObjectiveKind& kind = objective_of(f, saved.training, expected);
  saved.objective = kind.name;
  saved.options = objective_options(f, kind);
  const int64_t step = paired_step(f, saved.training);
  const train::ParamLayout layout = kind.layout(saved.config, saved.options);
  // The parameters: the model file's, and those the objective keeps in the state (MAE's decoder).
  TensorMap both = f.model.tensors;
  bool split = false;
  for (const train::ParamEntry& e : layout.entries)
    if (!kind.in_model_file(e.name)) {
      split = true;
      const auto it = f.state.tensors.find(e.name);
      if (it != f.state.tensors.end()) both[e.name] = it->second;
    }
  saved.params = gather(layout, both, "", split ? f.model_path + " + " + f.state_path : f.model_path);
  read_optimizer_state(f, layout, saved.recipe, step, kind.order_copies(saved.options), saved.adam_m, saved.adam_v,
                       saved.adam_step, saved.position);
  return saved;
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

std::string checkpoint_objective(const std::string& model_path) {
  complete_interrupted_save(model_path);
  const SafetensorsFile model = read_safetensors(model_path);
  const auto it = model.metadata.find("training");
  if (it == model.metadata.end()) throw Error(model_path + ": not a 'vitlens train' checkpoint (no training record)");
  const nlohmann::json record = parse_json_text(it->second, model_path + ": the training record");
  if (!record.is_object()) throw Error(model_path + ": the training record is not a JSON object");
  const auto objective = record.find("objective");
  if (objective == record.end()) return "classify";
  if (!objective->is_string()) throw Error(model_path + ": the training record's 'objective' is not a string");
  return objective->get<std::string>();
}

TensorMap model_file_tensors(const Objective& objective) {
  TensorMap model;
  for (auto& [name, tensor] : layout_tensors(objective.layout(), objective.params()))
    if (objective.kind().in_model_file(name)) model[name] = std::move(tensor);
  return model;
}

void save_checkpoint(const Trainer& trainer, const std::string& model_path, nlohmann::json training) {
  const Objective& objective = trainer.objective();
  const ObjectiveKind& kind = objective.kind();
  const train::ParamLayout& layout = objective.layout();
  const TrainPosition& pos = trainer.position();
  const nlohmann::json options = objective.options();
  training["objective"] = kind.name;
  training["step"] = pos.step;
  training["epoch"] = pos.epoch;
  training["recipe"] = trainer.recipe().to_json();
  training[kind.options_key] = options;
  SafetensorsFile state = state_file(layout, trainer.optimizer(), pos, trainer.recipe());
  state.metadata["objective"] = kind.name;
  state.metadata[kind.options_key] = options.dump();
  // What the model file does not hold (MAE's decoder) goes into the state, which resume reads and
  // viewers never see.
  TensorMap model;
  for (auto& [name, tensor] : layout_tensors(layout, objective.params())) {
    if (kind.in_model_file(name)) model[name] = std::move(tensor);
    else state.tensors[name] = std::move(tensor);
  }
  write_checkpoint(model_path, objective.config(), model, training, state, pos.step);
}

SavedTraining load_checkpoint(const std::string& model_path, const std::string& objective) {
  return saved_from(read_checkpoint_files(model_path), objective);
}

SavedTraining parse_checkpoint(const std::string& model_bytes, const std::string& state_bytes,
                               const std::string& model_what) {
  return saved_from(parse_checkpoint_files(model_bytes, state_bytes, model_what), "");
}

}  // namespace vitlens
