#pragma once
// JSON read from a file a user gave (a model's config, a checkpoint's companion config.json).
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/io/json_text.hpp"

namespace vitlens {

// `text` parsed strictly: throws vitlens::Error "<what> is not valid JSON", "<what> has the key
// 'k' twice in one object" (a JSON DOM would keep one of them silently) or "<what> is nested
// deeper than kMaxJsonDepth levels". Every string value is cut to `string_limit` bytes as it is
// read (capped_text). Nothing else is checked here; the caller reads the keys.
nlohmann::json parse_json_text(const std::string& text, const std::string& what, size_t string_limit = SIZE_MAX);

// A string read from a file, for showing: at most `limit` bytes, cut at a UTF-8 character
// boundary with "..." at the end when it was longer. Every name and description vitlens reads
// from a model goes through this as it is read, so no later use (a caption, a line in `vitlens
// info`, a message) has to guard against a string of megabytes.
std::string capped_text(const std::string& text, size_t limit);

}  // namespace vitlens
