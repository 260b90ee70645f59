// Export of the view on screen and the folders outputs go to (see controller.hpp, [SECTION]
// Output folders): the `vitlens export` command that writes the same files, and the job that
// writes them on the worker.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "control/controller.hpp"
#include "control/controller_detail.hpp"
#include "control/file_list.hpp"
#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "core/render/maps.hpp"

namespace vitlens::viewer {

using namespace detail;

std::string viewer_only_settings(const App& app) {
  if (!app.doc.ready()) return {};
  bool has_padding = false;
  for (uint8_t v : app.doc.comp->image.grid.patch_is_padding) has_padding = has_padding || v;
  // The pass on screen (and exported), not a choice whose pass is still running.
  const ForwardKey& key = app.doc.comp->key;
  const bool mask_ok = key.mask == MaskMode::Padding || key.mask == MaskMode::Causal ||
                       (key.mask == MaskMode::None && !has_padding) || (key.mask == MaskMode::Painted && key.painted.empty());
  // A temperature is `--temperature`; only "no scale" (softmax of the raw q.k) has no flag.
  const bool scale_ok = key.score_scale < 0.0f || key.temperature != 1.0f;
  std::string out;
  if (!mask_ok) out = std::string("the mask '") + mask_mode_name(key.mask) + "'";
  if (!scale_ok) out += std::string(out.empty() ? "" : " and ") + "no softmax scale";
  // Rollout mode: the export is `--rollout`, which takes no threshold (the viewer draws none on it).
  return out;
}

bool cli_equivalent(const App& app) { return app.doc.ready() && viewer_only_settings(app).empty(); }

namespace {

// `text` as one word of a POSIX shell command: inside single quotes, where nothing is special,
// each ' written as '\'' (close, an escaped quote, reopen). A pasted command then passes any file
// name through unchanged and never runs what it contains ($(...), backticks, ;).
std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// `text` bare when it is a plain word (a flag value such as "reg1" or "magma"), else shell_quoted.
std::string shell_word(const std::string& text) {
  const bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::strchr("_-.,:+=@%/", c) != nullptr;
  });
  return plain ? text : shell_quoted(text);
}

// The `--patch` or `--token` flag of the current query.
std::string query_flag(const App& app) {
  const int prefix = app.doc.comp->forward.prefix;
  if (app.ui.view.query_prefix >= 0 && app.ui.view.query_prefix < prefix)
    return " --token " + shell_word(prefix_token_short_name(app.doc.model->model.config, app.ui.view.query_prefix));
  return " --patch " + std::to_string(app.ui.view.query_row) + "," + std::to_string(app.ui.view.query_col);
}

// --heads when the model's head count came from it (a timm checkpoint without config.json):
// without it the command could not open the model.
bool model_needed_heads(const App& app) {
  for (const std::string& note : app.doc.model->model.notes)
    if (note.find("from --heads") != std::string::npos) return true;
  return false;
}

}  // namespace

std::string cli_command(const App& app, const std::string& out_dir) {
  if (!app.doc.ready()) return {};
  const UiState& ui = app.ui;
  // Paths are always quoted; other values only when they are not plain words.
  std::string cmd = "vitlens export " + shell_quoted(app.doc.image->path) + " --model " + shell_quoted(app.doc.model->path);
  if (model_needed_heads(app)) cmd += " --heads " + std::to_string(app.doc.model->model.config.num_heads);
  const auto& f = app.doc.comp->forward;
  const RolloutChoice& rollout = app.doc.comp->key.rollout;  // the pass on screen, resolved
  if (rollout.on) {
    cmd += " --rollout";
    if (ui.view.rollout_from_query || !f.has_class_token) cmd += query_flag(app);
    cmd += std::string(" --fusion ") + head_fusion_name(rollout.fusion) + " --discard " + format_float(rollout.discard);
    if (rollout.first_layer != 0 || rollout.last_layer != static_cast<int>(f.layers.size()) - 1)
      cmd += " --layer " + std::to_string(rollout.first_layer) + "-" + std::to_string(rollout.last_layer);
  } else {
    switch (ui.view.mode) {
      case MapMode::Query: cmd += query_flag(app); break;
      case MapMode::ClassToken: cmd += " --cls"; break;
      case MapMode::Received: cmd += " --received"; break;
      case MapMode::Pool: cmd += " --pool"; break;
    }
    if (ui.view.mode != MapMode::Pool && ui.view.layer >= 0 && ui.view.layer != static_cast<int>(f.layers.size()) - 1)
      cmd += " --layer " + std::to_string(current_layer(app));
  }
  if (app.doc.comp->key.mask == MaskMode::Causal) cmd += " --mask causal";
  if (app.doc.comp->key.temperature != 1.0f) cmd += " --temperature " + format_float(app.doc.comp->key.temperature);
  cmd += " --colormap " + shell_word(ui.display.style.colormap) + " --alpha " + format_float(ui.display.style.alpha);
  cmd += std::string(" --upsample ") + upsample_name(ui.display.style.upsample);
  cmd += std::string(" --normalize ") + normalize_name(ui.display.normalize);
  if (ui.display.threshold_on && !rollout.on) cmd += " --threshold " + format_float(ui.display.threshold);
  if (app.doc.comp->key.preprocess == Preprocess::Model) cmd += " --preprocess model";
  else if (ui.compute.max_side > 0) cmd += " --size " + std::to_string(ui.compute.max_side);
  // The precision that ran (auto resolved): the command gives the same files on this machine.
  if (app.doc.comp->key.precision != Precision::Fp32)
    cmd += std::string(" --precision ") + precision_name(app.doc.comp->key.precision);
  if (ui.export_raw && !rollout.on) cmd += " --raw";
  cmd += " --out " + shell_quoted(out_dir);
  return cmd;
}

void report_export_failure(App& app, const std::string& text) {
  set_message(app, text, true);
  ++app.export_failures;
  app.last_export_failure = text;
}

namespace {

// Why the view on screen cannot be exported now, or "".
std::string export_refusal(const App& app) {
  if (!app.doc.ready() || app.derived.comp_serial != app.doc.comp->serial || app.derived.view.maps.heads.empty())
    return "Nothing to export yet: open an image and a model first";
  if (app.ui.compute.rollout.on != app.doc.comp->key.rollout.on) {
    // Rollout mode whose pass failed or is still running: the screen does not show what was asked.
    return "Nothing to export yet: the " + std::string(app.ui.compute.rollout.on ? "rollout" : "maps") +
           " for these settings are not on screen" + (app.compute_job ? " (still computing)" : "");
  }
  if (app.doc.comp->key.rollout.on && app.derived.rollout_query < 0) return "Nothing to export yet: the rollout is not computed";
  return "";
}

// The export's settings for the view on screen, as `vitlens export` would take them.
ExportSettings view_export_settings(const App& app, const std::string& folder) {
  const Computation& c = *app.doc.comp;
  const UiState& ui = app.ui;
  ExportSettings s;
  s.out_dir = folder;
  s.layer = current_layer(app);
  s.causal = c.key.mask == MaskMode::Causal;
  s.temperature = c.key.temperature;
  s.style = ui.display.style;
  s.normalize = ui.display.normalize;
  s.raw = ui.export_raw && !c.key.rollout.on;
  s.max_side = c.key.max_side;
  s.precision = c.key.precision;
  if (c.key.preprocess == Preprocess::Model) {  // as `--preprocess model`: the transform, no --size
    s.transform = app.doc.model->transform;
    s.max_side = -1;
  }
  switch (ui.view.mode) {
    case MapMode::Query:
      s.select = QuerySelect::Patch;
      s.patch_row = ui.view.query_row;
      s.patch_col = ui.view.query_col;
      if (ui.view.query_prefix >= 0 && ui.view.query_prefix < c.forward.prefix) {
        s.select = QuerySelect::Token;
        s.token = prefix_token_short_name(app.doc.model->model.config, ui.view.query_prefix);
      }
      break;
    case MapMode::ClassToken: s.select = QuerySelect::ClassToken; break;
    case MapMode::Received: s.select = QuerySelect::Received; break;
    case MapMode::Pool:
      s.select = QuerySelect::Pool;
      s.layer = -1;  // the pool reads the last layer's output, whatever layer the slider shows
      break;
  }
  return s;
}

// What `vitlens export` cannot express, for <stem>_view.json beside the usual files.
nlohmann::json view_notes(const App& app) {
  const Computation& c = *app.doc.comp;
  const UiState& ui = app.ui;
  nlohmann::json notes;
  notes["note"] = "viewer settings beyond `vitlens export`; the PNGs and JSON beside this file show the view with them";
  notes["mask"] = mask_mode_name(c.key.mask);
  nlohmann::json painted = nlohmann::json::array();
  for (size_t i = 0; i < c.key.painted.size(); ++i)
    if (c.key.painted[i]) painted.push_back({static_cast<int>(i) / c.forward.grid_w, static_cast<int>(i) % c.forward.grid_w});
  notes["painted_patches"] = painted;
  // The scale of the exported pass: the model's 1/sqrt(d), or the factor it ran with.
  notes["scale"] = c.key.score_scale < 0.0f ? "1/sqrt(d)" : "custom";
  notes["score_scale"] = c.forward.score_scale;
  // Floats as the user set them (0.7, not 0.699999988).
  auto exact = [](float v) { return std::strtod(format_float(v).c_str(), nullptr); };
  if (ui.display.threshold_on && !c.key.rollout.on) {
    nlohmann::json kept = nlohmann::json::array();
    for (const ThresholdResult& t : app.derived.kept)
      kept.push_back({{"kept_patches", t.kept_patches}, {"total_patches", t.total_patches}, {"kept_mass", t.kept_mass}});
    notes["threshold"] = {{"mass", exact(ui.display.threshold)}, {"heads_then_mean", kept}};
  }
  return notes;
}

}  // namespace

void start_export(App& app, const std::string& requested_folder) {
  if (const std::string why = export_refusal(app); !why.empty()) {
    report_export_failure(app, why);
    return;
  }
  const std::string folder = output_path(requested_folder);
  try {
    prepare_output_folder(folder);
  } catch (const Error& e) {
    report_export_failure(app, std::string("Export failed: ") + e.what());
    return;
  }
  const Computation& c = *app.doc.comp;
  ExportJob job;
  job.model = app.doc.model;
  job.analysis = app.derived.view;  // image, forward state, request and the maps as shown
  job.analysis.forward_ms = c.forward_ms;
  job.analysis.maps_ms = app.derived.maps_ms;
  job.settings = view_export_settings(app, folder);
  job.options = forward_options_for_key(c.key);
  if (c.key.rollout.on) {
    job.rollout_query = app.derived.rollout_query;
    job.rollout_matrix = c.rollout;
    job.rollout_options = c.rollout_options;
    job.rollout_ms = c.rollout_ms;
  }
  const nlohmann::json notes = view_notes(app);
  if (!cli_equivalent(app)) job.view_notes = notes;
  // The command names every choice an export's files follow from; the notes, the viewer's own.
  job.same_files = std::to_string(c.serial) + "\n" + cli_command(app, folder) + "\n" + notes.dump();
  const uint64_t id = app.worker.submit(std::move(job));
  if (std::find(app.export_jobs.begin(), app.export_jobs.end(), id) != app.export_jobs.end()) {
    set_message(app, "The same export to " + folder + " is already waiting to be written", false);
    return;
  }
  set_message(app, "Exporting to " + folder + " ...", false);
  app.export_jobs.push_back(id);
}

// [SECTION] Output folders

std::string default_export_folder() {
  const char* env = std::getenv("VITLENS_EXPORT_DIR");
  if (env && *env) return output_path(env);
  const char* home = std::getenv("HOME");
  return output_path(home && *home ? join_path(home, "vitlens-exports") : std::string("vitlens-exports"));
}

std::string output_path(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  std::string s = ec ? path : p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

void prepare_output_folder(const std::string& folder) {
  std::error_code ec;
  if (std::filesystem::is_directory(folder, ec)) return;
  if (std::filesystem::exists(folder, ec)) throw Error(folder + ": is not a folder (choose a folder for the files)");
  if (output_path(folder) != default_export_folder())
    throw Error(folder + ": no such folder (choose an existing one, or leave the default " + default_export_folder() + ")");
  std::filesystem::create_directories(folder, ec);
  if (ec) throw Error(folder + ": cannot create the export folder (" + ec.message() + ")");
}

void check_output_path(const std::string& path, const std::string& flag) {
  std::error_code ec;
  const std::string folder = folder_of(path);
  if (path.empty() || path.back() == '/' || std::filesystem::is_directory(path, ec))
    throw Error(flag + " " + path + ": expects a file name");
  if (!std::filesystem::is_directory(folder, ec)) throw Error(flag + " " + path + ": the folder " + folder + " does not exist");
}

}  // namespace vitlens::viewer
