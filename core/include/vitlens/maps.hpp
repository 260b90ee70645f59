#pragma once
// Attention maps: what the viewer draws and the CLI exports, one (gh, gw) map per head over the
// patch keys, plus the mean over heads.
#include <string>
#include <vector>

#include "vitlens/vit.hpp"

namespace vitlens {

enum class MapMode { Query, ClassToken, Received };
const char* map_mode_name(MapMode mode);  // "query", "cls", "received"

struct MapRequest {
  MapMode mode = MapMode::Received;
  int layer = 0;
  int query_token = 0;  // token index (class token = 0 when present) for MapMode::Query
};

struct HeadMaps {
  int grid_h = 0, grid_w = 0;
  std::vector<MatRM> heads;  // H x (gh, gw): weight on each patch key
  MatRM mean;                // (gh, gw): mean over heads
  std::vector<float> cls_weight;  // (H) weight on the class token key (0 without one)
  MatRM prefix_weight;            // (H, prefix) weight on each prefix key: class, distillation, registers
};

// Throws vitlens::Error on a layer or query out of range or a mode the model cannot give
// (class token map without a class token).
HeadMaps attention_maps(const VitModel& model, const ForwardResult& result, const MapRequest& request);

// Token index of the patch under pixel (x, y) of the processed image / of patch (row, col) on a
// grid_h x grid_w patch grid. Throws vitlens::Error when outside.
int token_at_pixel(const VitConfig& config, int grid_h, int grid_w, int x, int y);
int token_at_patch(const VitConfig& config, int grid_h, int grid_w, int row, int col);

// Shannon entropy (nats) of a non-negative map normalised to sum 1; 0 for an all-zero map.
double map_entropy(const MatRM& map);

}  // namespace vitlens
