#pragma once
// Folder listings for the in-app file browser: folders first, then the files whose extension
// fits, each group sorted by name; hidden entries (leading '.') left out.
#include <string>
#include <utility>
#include <vector>

namespace vitlens::viewer {

const std::vector<std::string>& image_extensions();  // png, jpg, jpeg, bmp, tif, tiff, webp, ...
const std::vector<std::string>& model_extensions();  // safetensors

// Case-insensitive match of the text after the last '.'; an empty list matches every file.
bool has_extension(const std::string& name, const std::vector<std::string>& extensions);

struct FolderListing {
  std::vector<std::pair<std::string, bool>> entries;  // (name, is folder)
  std::string error;                                  // one line when the folder cannot be read
};
FolderListing list_folder(const std::string& folder, const std::vector<std::string>& extensions, bool folders_only);

// "/a/b" -> "/a", "/a" -> "/", "/" -> "/"; relative paths are made absolute first.
std::string parent_folder(const std::string& folder);
std::string join_path(const std::string& folder, const std::string& name);
// The folder a path is in ("" for a bare name); the absolute current folder for "".
std::string folder_of(const std::string& path);

}  // namespace vitlens::viewer
