// Textures and framebuffer reads. glGenTextures, glTexImage2D and glReadPixels are OpenGL 1.1,
// so GL/gl.h is all that is needed here.
#include "views/textures.hpp"

#include <GL/gl.h>

#include "control/app_state.hpp"

namespace vitlens::viewer {

void upload_rgb(Texture& texture, const cv::Mat& rgb8) {
  if (rgb8.empty() || rgb8.type() != CV_8UC3) return;
  const cv::Mat pixels = rgb8.isContinuous() ? rgb8 : rgb8.clone();
  if (texture.id == 0) {
    GLuint id = 0;
    glGenTextures(1, &id);
    texture.id = id;
    glBindTexture(GL_TEXTURE_2D, id);
    // Minified smoothly, magnified as blocks: a patch stays a crisp square on screen.
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_LINEAR);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_NEAREST);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_S, GL_CLAMP_TO_EDGE);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_T, GL_CLAMP_TO_EDGE);
  }
  glBindTexture(GL_TEXTURE_2D, texture.id);
  glPixelStorei(GL_UNPACK_ALIGNMENT, 1);  // rows of 3-byte pixels are not 4-byte aligned
  if (texture.width != pixels.cols || texture.height != pixels.rows) {
    glTexImage2D(GL_TEXTURE_2D, 0, GL_RGB, pixels.cols, pixels.rows, 0, GL_RGB, GL_UNSIGNED_BYTE, pixels.data);
    texture.width = pixels.cols;
    texture.height = pixels.rows;
  } else {
    glTexSubImage2D(GL_TEXTURE_2D, 0, 0, 0, pixels.cols, pixels.rows, GL_RGB, GL_UNSIGNED_BYTE, pixels.data);
  }
}

void destroy_texture(Texture& texture) {
  if (texture.id != 0) {
    const GLuint id = texture.id;
    glDeleteTextures(1, &id);
  }
  texture = Texture{};
}

void sync_textures(const Derived& derived, ViewTextures& textures) {
  if (textures.base_version != derived.base_version) {
    upload_rgb(textures.base, derived.base_rgb8);
    textures.base_version = derived.base_version;
  }
  if (textures.ramp_version != derived.ramp_version) {
    upload_rgb(textures.ramp, derived.colormap_ramp);
    textures.ramp_version = derived.ramp_version;
  }
  if (textures.pictures_version != derived.pictures_version) {
    const auto& heads = derived.pictures.heads;
    if (textures.heads.size() < heads.size()) textures.heads.resize(heads.size());
    for (size_t h = 0; h < heads.size(); ++h) upload_rgb(textures.heads[h], heads[h]);
    upload_rgb(textures.mean, derived.pictures.mean);
    textures.heads_shown = static_cast<int>(heads.size());
    textures.pictures_version = derived.pictures_version;
  }
  if (textures.layers_version != derived.layers_version) {
    upload_rgb(textures.layers, derived.layers.picture);
    textures.layers_version = derived.layers_version;
  }
  if (textures.rollout_version != derived.rollout_version) {
    upload_rgb(textures.rollout, derived.rollout_picture);
    textures.rollout_version = derived.rollout_version;
  }
}

void destroy_textures(ViewTextures& textures) {
  destroy_texture(textures.base);
  destroy_texture(textures.mean);
  destroy_texture(textures.ramp);
  destroy_texture(textures.layers);
  destroy_texture(textures.rollout);
  for (Texture& t : textures.heads) destroy_texture(t);
  textures.heads.clear();
}

cv::Mat read_framebuffer(int width, int height) {
  cv::Mat bottom_up(height, width, CV_8UC3);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadPixels(0, 0, width, height, GL_RGB, GL_UNSIGNED_BYTE, bottom_up.data);
  cv::Mat top_down;
  cv::flip(bottom_up, top_down, 0);
  return top_down;
}

}  // namespace vitlens::viewer
