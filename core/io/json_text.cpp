// JSON from outside the process, depth-limited (json_text.hpp).
#include "core/io/json_text.hpp"

namespace vitlens {

namespace {
struct TooDeep {};
}  // namespace

nlohmann::json parse_json_or_discarded(const std::string& text) {
  const nlohmann::json::parser_callback_t check = [](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    if (opens_level_past_limit(depth, event)) throw TooDeep{};
    return true;
  };
  try {
    return nlohmann::json::parse(text, check, false);
  } catch (const TooDeep&) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
}

}  // namespace vitlens
