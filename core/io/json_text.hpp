#pragma once
// JSON from outside the process (a user's file, a checkpoint's metadata), nested no deeper than
// kMaxJsonDepth. nlohmann's parser keeps its own stack, but writing a value out (dump), copying it
// and comparing it recurse once a level: a record of a million nested arrays parses, then
// overflows the stack when it is saved again. Every parse of outside text goes through here or
// through models/json_file.hpp's parse_json_text, which uses the same limit.
#include <string>

#include <nlohmann/json.hpp>

namespace vitlens {

constexpr int kMaxJsonDepth = 64;  // objects and arrays, one inside the other

// Whether a parser callback's event opens an object or array below kMaxJsonDepth others (depth
// counts the containers around the event: 0 for the outermost).
inline bool opens_level_past_limit(int depth, nlohmann::json::parse_event_t event) {
  return depth >= kMaxJsonDepth &&
         (event == nlohmann::json::parse_event_t::object_start || event == nlohmann::json::parse_event_t::array_start);
}

// `text` parsed, or a discarded value (is_discarded()) when it is not JSON or nests deeper than
// kMaxJsonDepth levels: for callers that treat both as "not one of ours".
nlohmann::json parse_json_or_discarded(const std::string& text);

}  // namespace vitlens
