#pragma once
// Attention maps: what the viewer draws and the CLI exports, one (gh, gw) map per head over the
// patch keys, plus the mean over heads.
#include <string>
#include <vector>

#include "core/base/enum_names.hpp"
#include "core/model/vit.hpp"

namespace vitlens {

// Pool: the attention pool's latent query (SigLIP's head, VitConfig::attention_pool) over the
// patch tokens; it sits after the last block, so a request's layer does not change it.
enum class MapMode { Query, ClassToken, Received, Pool };
inline constexpr EnumName<MapMode> kMapModeNames[] = {
    {MapMode::Query, "query"}, {MapMode::ClassToken, "cls"}, {MapMode::Received, "received"}, {MapMode::Pool, "pool"}};
const char* map_mode_name(MapMode mode);  // "query", "cls", "received", "pool"
bool parse_map_mode(const std::string& name, MapMode& mode);

struct MapRequest {
  MapMode mode = MapMode::Received;
  int layer = 0;
  int query_token = 0;  // token index (class token = 0 when present) for MapMode::Query
};

// A set of patches of a (gh, gw) grid: (gh*gw) 1 = in the set, raster order; empty = every patch.
using PatchSelection = std::vector<uint8_t>;
bool selected(const PatchSelection& patches, Eigen::Index i);  // true for every i when empty

struct HeadMaps {
  int grid_h = 0, grid_w = 0;
  std::vector<MatRM> heads;  // H x (gh, gw): weight on each patch key
  MatRM mean;                // (gh, gw): mean over heads
  std::vector<float> cls_weight;  // (H) weight on the class token key (0 without one)
  MatRM prefix_weight;            // (H, prefix) weight on each prefix key: class, distillation, registers
  // The image's patches: padding (added to reach a whole patch grid) is not part of the image, so
  // every statistic of a map (its scale, threshold, flatness, detail share, minimum) counts only
  // these. Its zero weights would otherwise pass for attention the head chose not to give.
  PatchSelection in_image;
  // After apply_threshold: (H + 1) heads then mean, the patches each map keeps. Empty: no threshold.
  std::vector<PatchSelection> kept;
};

// The image's patches of a forward pass's grid (padding left out): what HeadMaps::in_image holds.
PatchSelection image_patches(const ForwardResult& result);

// The patches map `index` (0 .. H-1 a head, H the mean) shows, the ones its scale is computed
// from: the kept ones after a threshold, else the image's.
const PatchSelection& shown_patches(const HeadMaps& maps, size_t index);

// Throws vitlens::Error on a layer or query out of range or a mode the model cannot give
// (class token map without a class token, pool map without an attention pool).
HeadMaps attention_maps(const VitModel& model, const ForwardResult& result, const MapRequest& request);

// Token index of the patch under pixel (x, y) of the processed image / of patch (row, col) on a
// grid_h x grid_w patch grid. Throws vitlens::Error when outside.
int token_at_pixel(const VitConfig& config, int grid_h, int grid_w, int x, int y);
int token_at_patch(const VitConfig& config, int grid_h, int grid_w, int row, int col);

// Prefix tokens as queries: the short names `--token` and the viewer use, "cls",
// "dist", "reg0" .. "reg<R-1>", and their token indices (class token first, as vit.hpp orders
// them). Throws vitlens::Error with one line when the model has no such token or the name is not
// one of these.
int prefix_token_index(const VitConfig& config, const std::string& name);
std::string prefix_token_short_name(const VitConfig& config, int token);  // "" for a patch token

// Shannon entropy (nats) of a non-negative map normalised to sum 1; 0 for an all-zero map.
double map_entropy(const MatRM& map);

// DINO's top-mass threshold (visualize_attention.py --threshold): sort the map ascending, divide
// by its sum, cumulative sum, keep the patches where cumval > 1 - mass: the fewest largest patches
// that hold `mass` of the total. Two changes from DINO, both for maps with equal values:
//  - ties are kept or dropped together: values within kTieTolerance of the map's maximum of each
//    other form one group (float noise counts as equal), and a group is kept when any of it would
//    be (so the kept mass is at least `mass`), never split by patch index;
//  - a map whose values are all equal (within the same tolerance) has no region to keep: the
//    result says `no_structure` and keeps the whole map unchanged.
constexpr float kTieTolerance = 1e-4f;  // relative to the map's maximum: far below one colour level (1/256)
struct ThresholdResult {
  MatRM kept_map;            // (gh, gw) the map with every dropped patch set to 0
  PatchSelection kept;       // (gh*gw) 1 = kept
  int kept_patches = 0, total_patches = 0;  // total: the patches considered (the image's)
  double kept_mass = 0.0;    // share of the map's sum that the kept patches hold
  bool no_structure = false; // all values equal within the tolerance (or all zero): nothing to single out
};
// mass in (0, 1]. Only the patches in `patches` take part (the image's: HeadMaps::in_image); the
// others are never kept and count for nothing. Throws vitlens::Error when mass is outside (0, 1].
ThresholdResult keep_top_mass(const MatRM& map, float mass, const PatchSelection& patches = {});

// keep_top_mass over the image's patches of every head and of the mean; the maps become the kept
// maps and maps.kept records what each keeps. Returns (H + 1) results, heads then mean.
std::vector<ThresholdResult> apply_threshold(HeadMaps& maps, float mass);

// The smallest value of the map over `patches` (0 when none is selected): padding's zeros left out.
float map_min(const MatRM& map, const PatchSelection& patches);

}  // namespace vitlens
