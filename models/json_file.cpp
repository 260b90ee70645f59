// Strict JSON from files, and capped strings (json_file.hpp).
#include "models/json_file.hpp"

#include <set>
#include <vector>

#include "core/base/error.hpp"

namespace vitlens {

using nlohmann::json;

nlohmann::json parse_json_text(const std::string& text, const std::string& what, size_t string_limit) {
  // The parser's callback sees each object open and close and each key: one set of keys per open
  // object finds a key given twice before the DOM replaces the first value with the second.
  std::vector<std::set<std::string>> open_objects;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (opens_level_past_limit(depth, event))
      throw Error(what + " is nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second)
        throw Error(what + " has the key '" + capped_text(key, 200) + "' twice in one object");
    } else if (event == json::parse_event_t::value && parsed.is_string() &&
               parsed.get_ref<const std::string&>().size() > string_limit) {
      parsed = capped_text(parsed.get_ref<const std::string&>(), string_limit);
    }
    return true;
  };
  try {
    return json::parse(text, check);
  } catch (const json::exception&) {
    throw Error(what + " is not valid JSON");
  }
}

std::string capped_text(const std::string& text, size_t limit) {
  if (text.size() <= limit) return text;
  const std::string mark = "...";
  size_t cut = limit > mark.size() ? limit - mark.size() : 0;
  // Back to the first byte of a character: UTF-8 continuation bytes are 10xxxxxx.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + mark;
}

}  // namespace vitlens
