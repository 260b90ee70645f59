#pragma once
// Small helpers the controller's files share (controller.cpp, derived.cpp, export_view.cpp,
// state_json.cpp, script_verbs.cpp); not for the views.
#include <chrono>
#include <string>

#include "control/app.hpp"
#include "core/render/maps.hpp"

namespace vitlens::viewer::detail {

double ms_since(std::chrono::steady_clock::time_point t0);
void set_message(App& app, const std::string& text, bool error);
// Writes app.settings to the settings file (when there is one); a failure becomes the message.
void persist(App& app);
// The shortest text that reads back as the same float (0.6f -> "0.6", not "0.600000024").
std::string format_float(float v);
// The query's token: the chosen prefix token, else the pinned patch.
int query_token(const App& app);
// What the maps show: the map mode's request, or in rollout mode the attention of the rollout's
// own row (the class token, or the query), so the layers x heads grid shows where that token looks.
MapRequest shown_request(const App& app);
bool in_grid(const App& app, int row, int col);

}  // namespace vitlens::viewer::detail
