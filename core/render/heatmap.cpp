// Attention maps to pictures. OpenCV's colour maps (cv::applyColorMap) supply the palettes.
#include "core/render/heatmap.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include <opencv2/imgproc.hpp>

#include "core/base/error.hpp"

namespace vitlens {

const char* upsample_name(Upsample upsample) { return enum_name(kUpsampleNames, upsample); }
bool parse_upsample(const std::string& name, Upsample& upsample) { return parse_enum(kUpsampleNames, name, upsample); }

namespace {

struct NamedMap {
  const char* name;
  int cv_code;
};
const NamedMap kColormaps[] = {
    {"viridis", cv::COLORMAP_VIRIDIS}, {"inferno", cv::COLORMAP_INFERNO}, {"magma", cv::COLORMAP_MAGMA},
    {"plasma", cv::COLORMAP_PLASMA},   {"jet", cv::COLORMAP_JET},         {"turbo", cv::COLORMAP_TURBO},
    {"hot", cv::COLORMAP_HOT},         {"bone", cv::COLORMAP_BONE},       {"cividis", cv::COLORMAP_CIVIDIS},
};

int colormap_code(const std::string& name) {
  for (const auto& m : kColormaps)
    if (name == m.name) return m.cv_code;
  std::string known;
  for (const auto& n : colormap_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown colormap '" + name + "' (known: " + known + ")");
}

cv::Mat to_rgb8(const cv::Mat& rgb01) {
  cv::Mat out;
  rgb01.convertTo(out, CV_8UC3, 255.0);
  return out;
}

}  // namespace

const std::vector<std::string>& colormap_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& m : kColormaps) v.push_back(m.name);
    return v;
  }();
  return names;
}

bool is_colormap(const std::string& name) {
  const auto& names = colormap_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

cv::Mat apply_colormap(const cv::Mat& unit_values, const std::string& colormap) {
  const int code = colormap_code(colormap);
  cv::Mat bytes, bgr, rgb;
  unit_values.convertTo(bytes, CV_8U, 255.0);  // saturating: values are clamped to [0, 255]
  cv::applyColorMap(bytes, bgr, code);
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  return rgb;
}

cv::Mat upsample_map(const MatRM& map, int patch_size, float scale_max, Upsample upsample) {
  cv::Mat grid(static_cast<int>(map.rows()), static_cast<int>(map.cols()), CV_32F);
  const float inv = scale_max > 0.0f ? 1.0f / scale_max : 0.0f;
  for (int r = 0; r < grid.rows; ++r)
    for (int c = 0; c < grid.cols; ++c) grid.at<float>(r, c) = std::clamp(map(r, c) * inv, 0.0f, 1.0f);
  cv::Mat pixels;
  cv::resize(grid, pixels, cv::Size(grid.cols * patch_size, grid.rows * patch_size), 0, 0,
             upsample == Upsample::Nearest ? cv::INTER_NEAREST : cv::INTER_LINEAR);
  return pixels;
}

cv::Mat heatmap_overlay(const cv::Mat& rgb01, const MatRM& map, int patch_size, float scale_max,
                        const HeatmapStyle& style) {
  if (!(style.alpha >= 0.0f && style.alpha <= 1.0f)) throw Error("alpha must be in [0, 1]");
  const cv::Mat heat = apply_colormap(upsample_map(map, patch_size, scale_max, style.upsample), style.colormap);
  if (heat.size() != rgb01.size()) throw Error("internal: heatmap and image sizes differ");
  cv::Mat out;
  cv::addWeighted(to_rgb8(rgb01), 1.0 - style.alpha, heat, style.alpha, 0.0, out);
  return out;
}

// [SECTION] Montage layout

namespace {

constexpr int kFont = cv::FONT_HERSHEY_SIMPLEX;
constexpr int kGap = 4;     // pixels between tiles and around the canvas
constexpr int kLeading = 4; // pixels between text lines

// One font size for the whole montage: grows with the tiles, never below a legible 0.4 (about
// 9 px capitals).
double montage_font_scale(int column_w) { return std::clamp(column_w / 400.0, 0.4, 0.6); }

}  // namespace

namespace {

// Hershey glyphs reach above the capital height getTextSize reports (brackets, accents: about a
// quarter more, measured over printable ASCII at 0.4 to 0.6) and down to its baseline value.
int text_ascent(int cap_height) { return cap_height + cap_height / 4 + 1; }

}  // namespace

cv::Size text_extent(const std::string& text, double scale) {
  int baseline = 0;
  const cv::Size s = cv::getTextSize(text, kFont, scale, 1, &baseline);
  return {s.width, text_ascent(s.height) + baseline + 1};
}

std::vector<std::string> wrap_text(const std::string& text, double scale, int max_width) {
  std::vector<std::string> lines;
  auto fits = [&](const std::string& t) { return text_extent(t, scale).width <= max_width; };
  size_t start = 0;
  while (start <= text.size()) {
    const size_t newline = text.find('\n', start);
    const std::string paragraph = text.substr(start, newline == std::string::npos ? std::string::npos : newline - start);
    std::string line;
    size_t i = 0;
    while (i < paragraph.size()) {
      // The next word and the spaces before it.
      size_t word_start = paragraph.find_first_not_of(' ', i);
      if (word_start == std::string::npos) break;
      size_t word_end = paragraph.find(' ', word_start);
      if (word_end == std::string::npos) word_end = paragraph.size();
      const std::string word = paragraph.substr(word_start, word_end - word_start);
      const std::string joined = line.empty() ? word : line + " " + word;
      if (fits(joined)) {
        line = joined;
      } else if (!line.empty() && fits(word)) {
        lines.push_back(line);
        line = word;
      } else {
        // The word alone is too wide: cut it where it stops fitting (at least one character a line).
        if (!line.empty()) lines.push_back(line);
        line.clear();
        for (char c : word) {
          if (!line.empty() && !fits(line + c)) {
            lines.push_back(line);
            line.clear();
          }
          line += c;
        }
      }
      i = word_end;
    }
    lines.push_back(line);
    if (newline == std::string::npos) break;
    start = newline + 1;
  }
  return lines;
}

namespace {

// One line of text whose top is at `top`, added to the layout's texts.
void add_text_line(MontageLayout& layout, const std::string& text, double scale, int x, int top) {
  TextItem item;
  item.text = text;
  item.scale = scale;
  int baseline = 0;
  const cv::Size s = cv::getTextSize(text, kFont, scale, 1, &baseline);
  item.origin = cv::Point(x, top + text_ascent(s.height));
  // One pixel either side: anti-aliased strokes reach just past the measured glyph box.
  const cv::Size extent = text_extent(text, scale);
  item.box = cv::Rect(x - 1, top, extent.width + 2, extent.height);
  layout.texts.push_back(item);
}

// The colour bar below the tiles, from `y`: its title, the bar, the tick labels. Returns the y
// below it.
int layout_colour_bar(MontageLayout& layout, const ColourBarSpec& bar, double scale, int line_h, int y) {
  const int text_w = layout.canvas.width - 2 * kGap;
  y += kGap;
  for (const std::string& line : wrap_text(bar.title, scale, text_w)) {
    add_text_line(layout, line, scale, kGap, y);
    y += line_h;
  }
  const int bar_h = std::max(8, line_h);
  layout.colour_bar = cv::Rect(kGap, y, text_w, bar_h);
  y += bar_h + 2;
  // Tick labels centred under their position, kept on the canvas; the two ends always show,
  // an inner one only where it does not run into its neighbours.
  int left_end = std::numeric_limits<int>::min();
  const size_t n = bar.ticks.size();
  int right_start = std::numeric_limits<int>::max();
  if (n > 1) {
    const int w = text_extent(bar.ticks.back().second, scale).width;
    right_start = std::clamp(kGap + static_cast<int>(std::lround(bar.ticks.back().first * (text_w - 1))) - w / 2,
                             kGap, kGap + text_w - w);
  }
  for (size_t i = 0; i < n; ++i) {
    // A label wider than the bar is wrapped like any text.
    const std::string label = wrap_text(bar.ticks[i].second, scale, text_w).front();
    const int w = text_extent(label, scale).width;
    const int centre = kGap + static_cast<int>(std::lround(std::clamp(bar.ticks[i].first, 0.0f, 1.0f) * (text_w - 1)));
    const int x = std::clamp(centre - w / 2, kGap, kGap + text_w - w);
    const bool last = i + 1 == n;
    if (i > 0 && x < left_end + 6) continue;
    if (!last && x + w > right_start - 6) continue;
    add_text_line(layout, label, scale, x, y);
    left_end = x + w;
  }
  y += line_h;
  return y;
}

}  // namespace

MontageLayout layout_montage(cv::Size tile_size, const std::vector<std::string>& labels, int tile_count, int columns,
                             const ColourBarSpec* bar, const std::vector<std::string>& caption) {
  if (tile_count < 1 || tile_size.width < 1 || tile_size.height < 1) throw Error("montage: no tiles");
  MontageLayout layout;
  const int long_side = std::max(tile_size.width, tile_size.height);
  layout.zoom = long_side >= kMinMontageTile ? 1 : (kMinMontageTile + long_side - 1) / long_side;
  const cv::Size cell(tile_size.width * layout.zoom, tile_size.height * layout.zoom);
  // A tall thin tile still gets a column wide enough for its label.
  const int column_w = std::max(cell.width, kMinMontageTile);
  const double scale = montage_font_scale(column_w);
  const int line_h = text_extent("Ag", scale).height + kLeading;
  columns = std::max(1, std::min(columns, tile_count));
  const int rows = (tile_count + columns - 1) / columns;
  // A picture with a colour bar or a caption is at least kMinLegendWidth wide (the tiles centred),
  // so a one-tile picture's caption is not wrapped a few words a line.
  const int grid_w = columns * (column_w + kGap) + kGap;
  const bool legend = (bar && !bar->ticks.empty()) || !caption.empty();
  layout.canvas.width = legend ? std::max(grid_w, kMinLegendWidth) : grid_w;
  const int grid_x = (layout.canvas.width - grid_w) / 2;

  auto add_line = [&](const std::string& text, int x, int top) { add_text_line(layout, text, scale, x, top); };

  int y = kGap;
  for (int r = 0; r < rows; ++r) {
    // The label strip is as tall as the row's longest wrapped label.
    std::vector<std::vector<std::string>> wrapped;
    size_t strip_lines = 1;
    for (int c = 0; c < columns; ++c) {
      const size_t i = static_cast<size_t>(r * columns + c);
      wrapped.push_back(i < labels.size() && static_cast<int>(i) < tile_count ? wrap_text(labels[i], scale, column_w)
                                                                              : std::vector<std::string>{});
      strip_lines = std::max(strip_lines, wrapped.back().size());
    }
    for (int c = 0; c < columns && r * columns + c < tile_count; ++c) {
      const int x = grid_x + kGap + c * (column_w + kGap);
      for (size_t k = 0; k < wrapped[static_cast<size_t>(c)].size(); ++k)
        add_line(wrapped[static_cast<size_t>(c)][k], x, y + static_cast<int>(k) * line_h);
      const int strip_h = static_cast<int>(strip_lines) * line_h;
      layout.tiles.emplace_back(x + (column_w - cell.width) / 2, y + strip_h, cell.width, cell.height);
    }
    y += static_cast<int>(strip_lines) * line_h + cell.height + kGap;
  }

  const int text_w = layout.canvas.width - 2 * kGap;
  if (bar && !bar->ticks.empty()) y = layout_colour_bar(layout, *bar, scale, line_h, y);
  if (!caption.empty()) y += kGap;
  for (const std::string& paragraph : caption)
    for (const std::string& line : wrap_text(paragraph, scale, text_w)) {
      add_line(line, kGap, y);
      y += line_h;
    }
  layout.canvas.height = y + kGap;
  return layout;
}

cv::Mat montage(const std::vector<cv::Mat>& tiles, const std::vector<std::string>& labels, int columns,
                const ColourBarSpec* bar, const std::vector<std::string>& caption) {
  if (tiles.empty()) throw Error("montage: no tiles");
  const MontageLayout layout =
      layout_montage(tiles[0].size(), labels, static_cast<int>(tiles.size()), columns, bar, caption);
  cv::Mat out(layout.canvas, CV_8UC3, cv::Scalar(24, 24, 24));
  for (size_t i = 0; i < tiles.size(); ++i) {
    if (tiles[i].size() != tiles[0].size() || tiles[i].type() != CV_8UC3) throw Error("montage: tiles differ in size");
    cv::Mat zoomed;
    cv::resize(tiles[i], zoomed, layout.tiles[i].size(), 0, 0, cv::INTER_NEAREST);
    zoomed.copyTo(out(layout.tiles[i]));
  }
  if (bar && !layout.colour_bar.empty()) {
    cv::Mat ramp(1, layout.colour_bar.width, CV_32F);
    for (int x = 0; x < ramp.cols; ++x) ramp.at<float>(0, x) = static_cast<float>(x) / static_cast<float>(std::max(1, ramp.cols - 1));
    cv::Mat strip;
    cv::resize(apply_colormap(ramp, bar->colormap), strip, layout.colour_bar.size(), 0, 0, cv::INTER_NEAREST);
    strip.copyTo(out(layout.colour_bar));
  }
  for (const TextItem& t : layout.texts)
    cv::putText(out, t.text, t.origin, kFont, t.scale, cv::Scalar(235, 235, 235), 1, cv::LINE_AA);
  return out;
}

}  // namespace vitlens
