// Folder listings for the file browser (see file_list.hpp).
#include "control/file_list.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>

namespace vitlens::viewer {

namespace fs = std::filesystem;

const std::vector<std::string>& image_extensions() {
  // What OpenCV's imdecode reads on Debian (libopencv-imgcodecs).
  static const std::vector<std::string> exts = {"png", "jpg", "jpeg", "bmp", "tif", "tiff", "webp",
                                                "ppm", "pgm", "pbm", "pnm", "jp2", "exr", "hdr", "pfm"};
  return exts;
}

const std::vector<std::string>& model_extensions() {
  static const std::vector<std::string> exts = {"safetensors"};
  return exts;
}

bool has_extension(const std::string& name, const std::vector<std::string>& extensions) {
  if (extensions.empty()) return true;
  const auto dot = name.find_last_of('.');
  if (dot == std::string::npos || dot + 1 >= name.size()) return false;
  std::string ext = name.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::find(extensions.begin(), extensions.end(), ext) != extensions.end();
}

FolderListing list_folder(const std::string& folder, const std::vector<std::string>& extensions, bool folders_only) {
  FolderListing out;
  std::vector<std::string> folders, files;
  std::error_code ec;
  fs::directory_iterator it(folder.empty() ? "." : folder, fs::directory_options::skip_permission_denied, ec);
  if (ec) {
    out.error = folder + ": cannot list the folder (" + ec.message() + ")";
    return out;
  }
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) {
      out.error = folder + ": listing stopped (" + ec.message() + ")";
      break;
    }
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    std::error_code type_ec;
    if (it->is_directory(type_ec)) {
      folders.push_back(name);
    } else if (!folders_only && has_extension(name, extensions)) {
      files.push_back(name);
    }
  }
  std::sort(folders.begin(), folders.end());
  std::sort(files.begin(), files.end());
  for (auto& f : folders) out.entries.emplace_back(std::move(f), true);
  for (auto& f : files) out.entries.emplace_back(std::move(f), false);
  return out;
}

std::string parent_folder(const std::string& folder) {
  std::error_code ec;
  fs::path p = fs::absolute(folder.empty() ? "." : folder, ec).lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  p = fs::path(s);
  const fs::path parent = p.parent_path();
  return parent.empty() ? std::string("/") : parent.string();
}

std::string join_path(const std::string& folder, const std::string& name) {
  if (folder.empty()) return name;
  if (folder.back() == '/') return folder + name;
  return folder + "/" + name;
}

std::string folder_of(const std::string& path) {
  std::error_code ec;
  if (path.empty()) return fs::current_path(ec).string();
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? fs::current_path(ec).string() : parent.string();
}

}  // namespace vitlens::viewer
