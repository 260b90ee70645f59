#pragma once
// OpenGL textures of the pictures core draws (CV_8UC3 RGB). A texture keeps its id for its whole
// life, so an update after the views were drawn still shows in the same frame.
#include <cstdint>
#include <vector>

#include <opencv2/core.hpp>

namespace vitlens::viewer {

struct Texture {
  unsigned int id = 0;  // GLuint
  int width = 0, height = 0;
  void* imgui_id() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(id)); }  // ImTextureID
};

// Creates the texture on first use; re-uploads in place (same id) afterwards.
void upload_rgb(Texture& texture, const cv::Mat& rgb8);
void destroy_texture(Texture& texture);

struct ViewTextures {
  Texture base;                // the processed image
  std::vector<Texture> heads;  // (H), only ever grows
  Texture mean;
  Texture ramp;                // (1, 256) the colour map, for the colour bars
  Texture layers;              // the layers x heads grid, one pixel per patch (layer_grid.hpp)
  Texture rollout;             // the rollout map over the image (rollout mode)
  uint64_t pictures_version = 0, base_version = 0, ramp_version = 0, layers_version = 0, rollout_version = 0;
  int heads_shown = 0;         // how many of `heads` hold the current model's maps
};

struct Derived;
// Uploads what changed since the last call.
void sync_textures(const Derived& derived, ViewTextures& textures);
void destroy_textures(ViewTextures& textures);

// The framebuffer as CV_8UC3 RGB, top row first (OpenGL reads bottom-up).
cv::Mat read_framebuffer(int width, int height);

}  // namespace vitlens::viewer
