// The Train window's settings (train_session.hpp): `key=value` parsing with `vitlens train`'s
// ranges, their checks, and the model, recipe and MAE options a run is made of.
#include "training/train_settings.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/base/utf8.hpp"

namespace vitlens::viewer {

const char* train_state_name(TrainState state) {
  switch (state) {
    case TrainState::Idle: return "idle";
    case TrainState::Loading: return "loading";
    case TrainState::Running: return "running";
    case TrainState::Paused: return "paused";
    case TrainState::Stopped: return "stopped";
    case TrainState::Finished: return "finished";
    case TrainState::Failed: return "failed";
  }
  return "?";
}

namespace {

bool whole_int(const std::string& text, long long lo, long long hi, long long& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || errno != 0 || v < lo || v > hi) return false;
  out = v;
  return true;
}

bool finite_number(const std::string& text, double& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v)) return false;
  out = v;
  return true;
}

// The whole-number settings with the ranges `vitlens train`'s flags accept; set_train_option parses
// them and check_train_settings re-checks them, since the window's fields write them directly.
struct IntSetting {
  const char* key;
  int TrainSettings::*member;
  long long lo, hi;
};
const IntSetting kIntSettings[] = {
    {"limit", &TrainSettings::limit, 0, 100000000},
    {"depth", &TrainSettings::depth, 1, 64},
    {"embed-dim", &TrainSettings::embed_dim, 4, 1024},
    {"heads", &TrainSettings::heads, 1, 64},
    {"patch", &TrainSettings::patch, 1, 64},
    {"batch", &TrainSettings::batch, 1, 4096},
    {"epochs", &TrainSettings::epochs, 1, 10000},
    {"crop-pad", &TrainSettings::crop_pad, 0, 16},
    {"threads", &TrainSettings::threads, 0, 256},
    {"img-size", &TrainSettings::img_size, 4, 1024},
    {"probe-every", &TrainSettings::probe_every, 1, 1000000},
    {"eval-every", &TrainSettings::eval_every, 0, 100000000},
    {"decoder-dim", &TrainSettings::decoder_dim, 4, 1024},
    {"decoder-depth", &TrainSettings::decoder_depth, 1, 16},
    {"decoder-heads", &TrainSettings::decoder_heads, 1, 64},
    {"crops-per-photo", &TrainSettings::crops_per_photo, 1, 100000},
};

std::string range_text(const IntSetting& f) {
  return "[" + std::to_string(f.lo) + ", " + std::to_string(f.hi) + "]";
}

}  // namespace

double val_split_of(const TrainSettings& s) {
  return s.val_split >= 0.0 ? s.val_split : (s.data == "fashion-mnist" ? 0.0 : 0.1);
}

int image_side(const TrainSettings& s) { return s.data == "fashion-mnist" ? 28 : s.img_size; }

VitConfig config_of(const TrainSettings& s) {
  VitConfig c = model_shape_of(s, image_side(s), true);
  if (is_photo_data(s.data)) {  // as `vitlens train --data photos[:DIR]` names its encoder
    c.name = "vitlens-mae";
    c.description = "ViT encoder trained in the vitlens viewer by masked patch prediction (MAE) on the photos in " +
                    photo_data_dir(s.data);
  } else {
    c.name = "vitlens-trained";
    c.description = "ViT trained in the vitlens viewer on " + s.data;
  }
  return c;
}

Recipe recipe_of(const TrainSettings& s) {
  Recipe r = recipe_of_settings(s);
  if (is_photo_data(s.data)) {
    // As the CLI's MAE recipe: no labels to smooth (the classifier's default smoothing is ignored);
    // the random crops are the augmentation, flipped unless turned off.
    r.label_smoothing = 0.0;
    r.augment = r.flip = s.flip_crops;
  }
  return r;
}

MaeOptions mae_options_of(const TrainSettings& s) {
  MaeOptions o;
  o.shape.mask_ratio = s.mask_ratio;
  o.shape.decoder_dim = s.decoder_dim;
  o.shape.decoder_depth = s.decoder_depth;
  o.shape.decoder_heads = s.decoder_heads;
  o.crops_per_photo = s.crops_per_photo;
  return o;
}

std::string set_train_option(TrainSettings& s, const std::string& key, const std::string& value) {
  long long i = 0;
  double f = 0.0;
  auto int_option = [&](int& target, long long lo, long long hi) -> std::string {
    if (!whole_int(value, lo, hi, i))
      return key + "=" + value + ": expected a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    target = static_cast<int>(i);
    return "";
  };
  auto real_option = [&](double& target) -> std::string {
    if (!finite_number(value, f)) return key + "=" + value + ": expected a number";
    target = f;
    return "";
  };
  for (const IntSetting& field : kIntSettings)
    if (key == field.key) return int_option(s.*field.member, field.lo, field.hi);
  if (key == "seed") {
    if (!whole_int(value, 0, (1LL << 62), i)) return key + "=" + value + ": expected a whole number >= 0";
    s.seed = static_cast<uint64_t>(i);
    return "";
  }
  if (key == "mlp-ratio") return real_option(s.mlp_ratio);
  if (key == "lr") return real_option(s.lr);
  if (key == "weight-decay") return real_option(s.weight_decay);
  if (key == "warmup") return real_option(s.warmup);
  if (key == "label-smoothing") return real_option(s.label_smoothing);
  if (key == "drop-path") return real_option(s.drop_path);
  if (key == "mask-ratio") return real_option(s.mask_ratio);
  if (key == "val-split") return real_option(s.val_split);
  if (key == "augment") {
    if (value != "on" && value != "off") return key + "=" + value + ": expected on or off";
    s.augment = s.flip_crops = value == "on";
    return "";
  }
  if (key == "out") {
    if (value.empty()) return "out= needs a folder";
    s.out = value;
    return "";
  }
  return "unknown training option '" + key +
         "' (known: limit, depth, embed-dim, heads, patch, mlp-ratio, batch, epochs, lr, weight-decay, warmup, "
         "label-smoothing, drop-path, val-split, augment, crop-pad, seed, threads, img-size, probe-every, eval-every, out, mask-ratio, "
         "decoder-dim, decoder-depth, decoder-heads, crops-per-photo)";
}

void put_train_losses(nlohmann::json& record, const std::vector<float>& losses) {
  const size_t skip = losses.size() > kMaxSavedLosses ? losses.size() - kMaxSavedLosses : 0;
  record["train_loss"] = std::vector<float>(losses.begin() + static_cast<std::ptrdiff_t>(skip), losses.end());
  if (skip > 0) record["train_loss_first_step"] = static_cast<int64_t>(skip) + 1;
  else record.erase("train_loss_first_step");
}

std::string check_train_settings(const TrainSettings& s) {
  if (s.data.empty())
    return "no data: give 'fashion-mnist', a folder with one subfolder of images per class, or photos[:DIR]";
  if (!is_valid_utf8(s.data)) return std::string("data") + kNotUtf8;
  for (const IntSetting& f : kIntSettings)
    if (s.*f.member < f.lo || s.*f.member > f.hi)
      return std::string(f.key) + " must be in " + range_text(f) + ", got " + std::to_string(s.*f.member);
  if (s.embed_dim % s.heads != 0)
    return "embed-dim " + std::to_string(s.embed_dim) + " is not divisible by heads " + std::to_string(s.heads);
  if (image_side(s) % s.patch != 0)
    return "the image size " + std::to_string(image_side(s)) + " is not a multiple of patch " + std::to_string(s.patch);
  if (!(s.mlp_ratio > 0.0 && s.mlp_ratio <= 16.0)) return "mlp-ratio must be in (0, 16]";
  if (!(val_split_of(s) < 1.0)) return "val-split must be in [0, 1)";
  const VitConfig config = config_of(s);
  const std::string shape = config.validate();
  if (!shape.empty()) return "model shape: " + shape;
  if (is_photo_data(s.data)) {  // the checks `vitlens train --data photos` makes, with its words
    if (!(s.mask_ratio > 0.0 && s.mask_ratio < 1.0))
      return "mask-ratio must be in (0, 1), got " + std::to_string(s.mask_ratio);
    if (s.decoder_dim % s.decoder_heads != 0)
      return "decoder-dim " + std::to_string(s.decoder_dim) + " is not divisible by decoder-heads " +
             std::to_string(s.decoder_heads);
    if (s.drop_path != 0.0) return "drop-path applies to classifiers, not to photos";
    const std::string mae = mae_options_of(s).validate(config);
    if (!mae.empty()) return "model shape: " + mae;
  }
  return recipe_of(s).validate();
}

}  // namespace vitlens::viewer
