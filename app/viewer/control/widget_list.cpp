// The widgets drawn last frame, for the script and `--dump-widgets` (see controller.hpp, [SECTION]
// Widgets): finding one by its label and path, and the list as JSON.
#include <cstdio>

#include "control/controller.hpp"

namespace vitlens::viewer {

namespace {

std::vector<std::string> split_spec(const std::string& spec) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t sep = spec.find(" > ", start);
    parts.push_back(spec.substr(start, sep == std::string::npos ? std::string::npos : sep - start));
    if (sep == std::string::npos) break;
    start = sep + 3;
  }
  return parts;
}

// The parts before the label, in order, among the widget's window and sections (gaps allowed).
bool leading_parts_match(const std::vector<std::string>& parts, const std::vector<std::string>& places) {
  size_t next = 0;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    while (next < places.size() && places[next] != parts[i]) ++next;
    if (next == places.size()) return false;
    ++next;
  }
  return true;
}

std::string widget_path(const WidgetInfo& w) {
  std::string path = w.window;
  for (const std::string& s : w.sections) path += " > " + s;
  return path + " > " + w.label;
}

}  // namespace

const WidgetInfo* find_widget(const WidgetFrame& frame, const std::string& spec, std::string& error) {
  const std::vector<std::string> parts = split_spec(spec);
  std::vector<const WidgetInfo*> found;
  for (const WidgetInfo& w : frame.widgets) {
    if (!w.visible || (w.label != parts.back() && w.id_label != parts.back())) continue;
    std::vector<std::string> places = {w.window};
    places.insert(places.end(), w.sections.begin(), w.sections.end());
    if (leading_parts_match(parts, places)) found.push_back(&w);
  }
  if (found.size() == 1) return found.front();
  if (found.empty()) {
    std::string shown;
    for (const WidgetInfo& w : frame.widgets)
      if (w.visible && w.kind != WidgetKind::DropTarget) shown += (shown.empty() ? "" : ", ") + w.label;
    error = "no visible widget '" + spec + "' (visible: " + shown + ")";
  } else {
    error = "'" + spec + "' names " + std::to_string(found.size()) + " widgets:";
    for (const WidgetInfo* w : found) error += " [" + widget_path(*w) + "]";
    error += "; name the window or section too (WINDOW > SECTION > LABEL)";
  }
  return nullptr;
}

nlohmann::json widgets_json(const WidgetFrame& frame) {
  using nlohmann::json;
  json list = json::array();
  for (const WidgetInfo& w : frame.widgets) {
    char id[16];
    std::snprintf(id, sizeof id, "0x%08X", w.id);
    list.push_back({{"label", w.label}, {"id_label", w.id_label}, {"id", id}, {"window", w.window},
                    {"sections", w.sections}, {"path", widget_path(w)}, {"kind", widget_kind_name(w.kind)},
                    {"rect", {w.rect.x, w.rect.y, w.rect.w, w.rect.h}},
                    {"frame", {w.frame.x, w.frame.y, w.frame.w, w.frame.h}},
                    {"centre", {w.frame.x + 0.5f * w.frame.w, w.frame.y + 0.5f * w.frame.h}},
                    {"enabled", w.enabled}, {"visible", w.visible}});
    if (w.kind == WidgetKind::Input) list.back()["value"] = w.value;
  }
  json texts = json::array();
  for (const TextInfo& t : frame.texts)
    texts.push_back({{"text", t.text}, {"window", t.window}, {"rect", {t.rect.x, t.rect.y, t.rect.w, t.rect.h}},
                     {"width", t.width}, {"room", t.room}, {"wrapped", t.wrapped}});
  json windows = json::array();
  for (const WindowInfo& w : frame.windows)
    windows.push_back({{"name", w.name}, {"parent", w.parent}, {"kind", w.kind}, {"rect", {w.rect.x, w.rect.y, w.rect.w, w.rect.h}},
                       {"visible", {w.visible.x, w.visible.y, w.visible.w, w.visible.h}},
                       {"scroll", {w.scroll_x, w.scroll_y}}, {"scroll_max", {w.scroll_max_x, w.scroll_max_y}}});
  return {{"note", "rectangles are [x, y, w, h] in window pixels, origin at the window's top left; a text's width is what "
                   "it needs, room what its window or column had to the right of it; windows back to front"},
          {"display", {frame.display_w, frame.display_h}}, {"widgets", list}, {"texts", texts}, {"windows", windows},
          {"clashes", frame.clashes}};
}

}  // namespace vitlens::viewer
