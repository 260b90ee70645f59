// Labelled image sets from a folder tree: DataWalker (the one careful walk of a data folder, for
// ImageFolder classes and the photo corpus alike), ImageSet, load_image_folder (one subfolder per
// class, as torchvision's ImageFolder) and the seeded held-out split; also the helpers the data
// loaders share (data_internal.hpp). Legend: n = images, C = classes, H x W = image size, S = side.
#include "core/data/dataset.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <tuple>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <opencv2/imgproc.hpp>

#include "core/base/error.hpp"
#include "core/base/utf8.hpp"
#include "core/data/data_internal.hpp"
#include "core/io/image.hpp"

namespace vitlens {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// ImageSet
// ---------------------------------------------------------------------------------------------

int ImageSet::size() const { return static_cast<int>(labels.size()); }
int ImageSet::num_classes() const { return static_cast<int>(class_names.size()); }
const float* ImageSet::image(int i) const {
  return pixels.data() + static_cast<size_t>(i) * 3 * static_cast<size_t>(height) * static_cast<size_t>(width);
}

// ---------------------------------------------------------------------------------------------
// DataWalker: the one walk of a data folder (see dataset.hpp for the rules and why).
// ---------------------------------------------------------------------------------------------

namespace {

using FileId = std::pair<dev_t, ino_t>;

bool hidden_name(const char* name) { return name[0] == '.'; }

// The canonical path (every link resolved), or "" when it cannot be resolved.
std::string real_path(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (!resolved) return "";
  std::string out = resolved;
  std::free(resolved);
  return out;
}

bool inside(const std::string& real, const std::string& root_real) {
  if (real.empty() || root_real.empty()) return false;
  if (root_real == "/") return true;
  return real.compare(0, root_real.size(), root_real) == 0 &&
         (real.size() == root_real.size() || real[root_real.size()] == '/');
}

std::string errno_text(int err) { return std::strerror(err); }

// The names in the open folder `dir` (hidden ones left out), sorted in byte order; every entry
// counts against the walk's limit (`entries` of at most `max_entries`, named after `data_root`).
// Returns 0, or the errno of a listing that failed.
int read_names(DIR* d, const std::string& dir, const std::string& data_root, long max_entries, long& entries,
               std::vector<std::string>& names) {
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    // Every entry counts, hidden ones too: reading them is what takes the time.
    if (++entries > max_entries)
      throw Error(data_root + ": holds more than " + std::to_string(max_entries) +
                  " files and folders, the most vitlens reads from one data folder (stopped in " + dir + ")");
    if (!hidden_name(e->d_name)) names.emplace_back(e->d_name);
    errno = 0;
  }
  if (errno != 0) return errno;
  std::sort(names.begin(), names.end());
  return 0;
}

using FoundFile = std::tuple<fs::path, dev_t, ino_t>;  // a regular file reached, with its identity

// The files' paths in fs::path order (component by component), as the files were always listed (a
// run resumed from a checkpoint sees its images in the same order), each (device, inode) once.
std::vector<std::string> sorted_unique_files(std::vector<FoundFile>& found) {
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  std::set<FileId> seen_files;
  std::vector<std::string> files;
  for (const auto& [path, dev, ino] : found)
    if (seen_files.insert({dev, ino}).second) files.push_back(path.string());
  return files;
}

}  // namespace

DataWalker::DataWalker(std::string data_root, long max_entries)
    : data_root_(std::move(data_root)), max_entries_(max_entries) {}

FolderWalk DataWalker::walk(const std::string& folder, bool recursive) {
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) {
    const int err = errno;
    throw Error(folder + (err == ENOENT ? ": no such folder" : ": cannot open the folder (" + errno_text(err) + ")"));
  }
  if (!S_ISDIR(st.st_mode)) throw Error(folder + ": not a folder");
  const std::string root_real = real_path(folder);
  std::set<FileId> seen_folders{{st.st_dev, st.st_ino}};
  std::vector<FoundFile> found;  // every regular file reached, with its identity
  FolderWalk out;
  // Depth first, names in byte order: the folder a link and its target both reach is read under
  // the same path every time. An explicit stack, so a deep tree cannot exhaust the call stack.
  std::vector<std::string> pending{folder};
  while (!pending.empty()) {
    const std::string dir = std::move(pending.back());
    pending.pop_back();
    DIR* d = ::opendir(dir.c_str());
    struct Closer {
      DIR* d;
      ~Closer() {
        if (d) ::closedir(d);
      }
    } closer{d};
    std::vector<std::string> names;
    const int list_error = d ? read_names(d, dir, data_root_, max_entries_, entries_, names) : errno;
    if (list_error != 0) {
      const std::string line = dir + ": cannot read the folder (" + errno_text(list_error) + ")";
      if (dir == folder) throw Error(line);
      out.skipped.push_back(line);
      continue;
    }
    std::vector<std::string> subfolders;
    for (const std::string& name : names) {
      const std::string path = !dir.empty() && dir.back() == '/' ? dir + name : dir + "/" + name;
      struct stat link {};
      if (::fstatat(::dirfd(d), name.c_str(), &link, AT_SYMLINK_NOFOLLOW) != 0) {
        out.skipped.push_back(path + ": cannot read (" + errno_text(errno) + ")");
        continue;
      }
      struct stat target = link;
      const bool is_link = S_ISLNK(link.st_mode);
      if (is_link && ::fstatat(::dirfd(d), name.c_str(), &target, 0) != 0) {
        const int err = errno;
        out.skipped.push_back(path + (err == ELOOP   ? ": a link in a loop of links"
                                      : err == ENOENT ? ": a broken link (its target does not exist)"
                                                      : ": a link that cannot be followed (" + errno_text(err) + ")"));
        continue;
      }
      if (S_ISDIR(target.st_mode)) {
        if (is_link) {
          const std::string real = real_path(path);
          if (!inside(real, root_real)) {
            out.links_outside.push_back(path + ": a link to " + (real.empty() ? "a folder" : real) + ", outside " + folder);
            continue;
          }
        }
        if (!recursive) {
          out.folders.push_back(path);
          continue;
        }
        // Read already (an ancestor: a loop; or reached through another link): nothing new there.
        if (!seen_folders.insert({target.st_dev, target.st_ino}).second) continue;
        subfolders.push_back(path);
      } else if (S_ISREG(target.st_mode)) {
        found.emplace_back(path, target.st_dev, target.st_ino);
      } else {
        out.skipped.push_back(path + ": not a regular file (a device, pipe or socket), not an image");
      }
    }
    for (auto it = subfolders.rbegin(); it != subfolders.rend(); ++it) pending.push_back(std::move(*it));
  }
  out.files = sorted_unique_files(found);
  return out;
}

std::string links_outside_warning(const FolderReport& report) {
  if (report.links_outside == 0) return "";
  return "not following " + std::to_string(report.links_outside) + " link" + (report.links_outside == 1 ? "" : "s") +
         " to a folder outside the data folder (" + report.first_link_outside + ")";
}

// ---------------------------------------------------------------------------------------------
// What the data loaders share (data_internal.hpp)
// ---------------------------------------------------------------------------------------------

namespace data_internal {

void note_skip(FolderReport* report, const std::string& message) {
  if (!report) return;
  ++report->skipped;
  if (report->examples.size() < 5) report->examples.push_back(message);
}

// What a walk left out goes into the report: the same lines the user sees for unreadable images.
void note_walk(FolderReport* report, const FolderWalk& walk) {
  for (const std::string& line : walk.skipped) note_skip(report, line);
  if (!report) return;
  if (report->links_outside == 0 && !walk.links_outside.empty()) report->first_link_outside = walk.links_outside[0];
  report->links_outside += static_cast<int>(walk.links_outside.size());
}

// (h, w, 3) interleaved float -> (3, h, w) planar, written to `out`, clamped to [0, 1].
void append_planar(const cv::Mat& rgb, float* out) {
  const size_t plane = static_cast<size_t>(rgb.rows) * static_cast<size_t>(rgb.cols);
  for (int y = 0; y < rgb.rows; ++y) {
    const cv::Vec3f* row = rgb.ptr<cv::Vec3f>(y);
    for (int x = 0; x < rgb.cols; ++x) {
      const size_t at = static_cast<size_t>(y) * static_cast<size_t>(rgb.cols) + static_cast<size_t>(x);
      for (int c = 0; c < 3; ++c) out[static_cast<size_t>(c) * plane + at] = unit(row[x][c]);
    }
  }
}

// Down with area averaging (no aliasing), up with bilinear, as the header promises.
int interpolation_for(int from_side, int to_side) { return to_side < from_side ? cv::INTER_AREA : cv::INTER_LINEAR; }

void require_folder(const std::string& dir, const std::string& what) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;  // EACCES or a loop of links is not "no such folder"
    if (err == ENOENT) throw Error(dir + ": no such folder (" + what + ")");
    throw Error(dir + ": cannot open the folder (" + errno_text(err) + ")");
  }
  if (!S_ISDIR(st.st_mode)) throw Error(dir + ": not a folder (" + what + ")");
}

}  // namespace data_internal

using namespace data_internal;

namespace {

// torchvision Resize(S) then CenterCrop(S): the short side becomes S, the long side
// int(S * long / short) (Resize truncates), and the crop starts at round((side - S) / 2).
// A very elongated image (a 1 x 5000 strip at side 224 would be resized to 1.1 million x 224
// first) is cut to its centred square of the short side before resizing instead: the same
// pixels, up to the crop's rounding, without the huge intermediate.
cv::Mat resize_and_centre_crop(const cv::Mat& source, int side) {
  cv::Mat rgb = source;
  const int short_side = std::min(rgb.rows, rgb.cols);
  if (std::max(rgb.rows, rgb.cols) > 8 * short_side) {
    const int top = (rgb.rows - short_side) / 2, left = (rgb.cols - short_side) / 2;
    rgb = rgb(cv::Rect(left, top, short_side, short_side));
  }
  int w = side, h = side;
  if (rgb.cols > rgb.rows) w = static_cast<int>(static_cast<long long>(side) * rgb.cols / rgb.rows);
  if (rgb.rows > rgb.cols) h = static_cast<int>(static_cast<long long>(side) * rgb.rows / rgb.cols);
  cv::Mat resized;
  if (w == rgb.cols && h == rgb.rows) {
    resized = rgb;
  } else {
    cv::resize(rgb, resized, cv::Size(w, h), 0, 0, interpolation_for(short_side, side));
  }
  const int top = static_cast<int>(std::lround((h - side) / 2.0));
  const int left = static_cast<int>(std::lround((w - side) / 2.0));
  return resized(cv::Rect(left, top, side, side));
}

}  // namespace

ImageSet load_image_folder(const std::string& dir, int img_size, FolderReport* report) {
  if (img_size < 1 || img_size > 4096)
    throw Error(dir + ": image size must be 1 to 4096 px, got " + std::to_string(img_size));
  require_folder(dir, "expected one subfolder of images per class");
  DataWalker walker(dir);
  const FolderWalk top = walker.walk(dir, false);
  note_walk(report, top);
  // Byte order of the names (the walk's order), as Python's sorted() in torchvision's find_classes.
  std::vector<fs::path> class_dirs(top.folders.begin(), top.folders.end());
  if (class_dirs.empty()) throw Error(dir + ": has no class folders (expected one subfolder of images per class)");
  if (class_dirs.size() == 1)
    throw Error(dir + ": has a single class folder (" + class_dirs[0].filename().string() +
                "); a classifier needs at least 2 classes, one subfolder each");

  ImageSet set;
  set.height = set.width = img_size;
  set.source = dir;
  const size_t image_floats = 3 * static_cast<size_t>(img_size) * static_cast<size_t>(img_size);
  for (size_t c = 0; c < class_dirs.size(); ++c) {
    const std::string name = class_dirs[c].filename().string();
    set.class_names.push_back(utf8_escaped(name));  // a label, recorded in JSON: any bytes of the name shown
    const FolderWalk walk = walker.walk(class_dirs[c].string(), true);
    note_walk(report, walk);
    const std::vector<std::string>& files = walk.files;
    if (files.empty()) throw Error(class_dirs[c].string() + ": class folder '" + name + "' is empty; put images in it or remove it");
    int kept = 0;
    for (const std::string& file : files) {
      cv::Mat rgb;
      try {
        rgb = load_image(file, kMaxLoadSide, img_size).rgb01;  // short side kept for the crop
      } catch (const Error& e) {
        note_skip(report, e.what());
        continue;
      }
      const cv::Mat square = resize_and_centre_crop(rgb, img_size);
      set.pixels.resize(set.pixels.size() + image_floats);
      append_planar(square, set.pixels.data() + set.pixels.size() - image_floats);
      set.labels.push_back(static_cast<int32_t>(c));
      ++kept;
    }
    if (kept == 0)
      throw Error(class_dirs[c].string() + ": class folder '" + name + "' has no readable image (" +
                  std::to_string(files.size()) + " file" + (files.size() == 1 ? "" : "s") + " skipped)");
  }
  return set;
}

void split_holdout(const ImageSet& all, double val_fraction, uint64_t seed, ImageSet* train, ImageSet* val) {
  if (!train || !val) throw Error("split_holdout: train and val must not be null");
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw Error(all.source + ": held-out fraction must be in [0, 1), got " + std::to_string(val_fraction));
  const int classes = all.num_classes();
  std::vector<std::vector<int32_t>> by_class(static_cast<size_t>(std::max(classes, 0)));
  for (int i = 0; i < all.size(); ++i) {
    const int32_t label = all.labels[static_cast<size_t>(i)];
    if (label < 0 || label >= classes) throw Error(all.source + ": label " + std::to_string(label) + " out of range");
    by_class[static_cast<size_t>(label)].push_back(i);
  }
  // One generator for the whole split, classes in order: the same seed gives the same split.
  Rng rng(seed);
  std::vector<char> to_val(static_cast<size_t>(all.size()), 0);
  for (std::vector<int32_t>& members : by_class) {
    const int count = static_cast<int>(members.size());
    int n_val = static_cast<int>(std::lround(val_fraction * count));
    if (val_fraction > 0.0 && count >= 2) n_val = std::clamp(n_val, 1, count - 1);  // both sides see every class
    if (count < 2) n_val = 0;
    rng.shuffle(members);
    for (int k = 0; k < n_val; ++k) to_val[static_cast<size_t>(members[static_cast<size_t>(k)])] = 1;
  }
  ImageSet tr, va;
  for (ImageSet* part : {&tr, &va}) {
    part->height = all.height;
    part->width = all.width;
    part->class_names = all.class_names;
  }
  tr.source = all.source + " (train split)";
  va.source = all.source + " (held-out split)";
  const size_t image_floats = 3 * static_cast<size_t>(all.height) * static_cast<size_t>(all.width);
  for (int i = 0; i < all.size(); ++i) {
    ImageSet& part = to_val[static_cast<size_t>(i)] ? va : tr;
    part.labels.push_back(all.labels[static_cast<size_t>(i)]);
    part.pixels.insert(part.pixels.end(), all.image(i), all.image(i) + image_floats);
  }
  // Assigned last: `train` or `val` may be `all` itself.
  *train = std::move(tr);
  *val = std::move(va);
}

}  // namespace vitlens
