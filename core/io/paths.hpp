#pragma once
// Path text, split at the last '/': the one place app/, models/ and core/ take a path apart.
// Plain string operations (no file system access, no normalisation), so the folder a file is
// written into is exactly the folder the user named.
#include <string>

namespace vitlens {

// The folder `path` is in: "a/b" -> "a", "b" -> ".", "/b" -> "/", "a/b/" -> "a/b".
std::string parent_dir(const std::string& path);
// The last part of `path`: "a/b.png" -> "b.png", "b.png" -> "b.png", "a/" -> "".
std::string base_name(const std::string& path);

}  // namespace vitlens
