#pragma once
// UTF-8 checks for text that goes into JSON: a Linux file name may be any bytes, and nlohmann's
// dump refuses a string that is not UTF-8 (type_error 316) when a record is written.
#include <string>

namespace vitlens {

// What a training front end says of a setting it records that is not UTF-8, after its name.
constexpr const char* kNotUtf8 =
    " is not valid UTF-8 (text in another encoding?): a checkpoint records it as JSON text, which must be "
    "UTF-8; give it in UTF-8 (a folder: rename it, or link it under a UTF-8 name)";

// The length in bytes of the well-formed character that starts at text[i] (i < text.size()), or 0
// when the bytes there are not one.
size_t utf8_char_length(const std::string& text, size_t i);

// Whether `text` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, at most U+10FFFF).
bool is_valid_utf8(const std::string& text);

// `text` with every byte that does not belong to a well-formed character written as "\xNN"
// (lower-case hex); well-formed text comes back unchanged. For labels made from file names. With
// `escape_backslash`, each '\' is written as "\x5c" too, which makes the mapping one-to-one (a
// name read back from it is exact: export records).
std::string utf8_escaped(const std::string& text, bool escape_backslash = false);

}  // namespace vitlens
