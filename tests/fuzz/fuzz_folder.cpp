// libFuzzer harness: the walk of a training data folder (DataWalker, then load_image_folder and
// load_photo_corpus on the same tree). The input is a small program that builds a folder tree in a
// temporary folder: two bytes per step, (what, argument), then the argument's further bytes:
//   0 mkdir    1 a tiny PNG    2 a file of input bytes    3 a symbolic link    4 a hard link
//   5 a named pipe    (parent folder, name and link target are picked from lists by the bytes)
// Links may point to ".", "..", "/", a folder or file outside the data folder, themselves, nowhere,
// or anything made so far. The walk must end, read each folder of the tree at most once (so no
// more entries than the tree holds), list each file once, and list only files whose folder is
// inside the data folder. Any vitlens::Error is fine; anything else is a finding. README "Fuzzing".
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "core/data/dataset.hpp"
#include "core/base/error.hpp"

namespace {

namespace fs = std::filesystem;

struct Work {
  std::string base, root, outside;
  std::vector<unsigned char> png;  // a 4 x 4 RGB PNG
};

const Work& work() {
  static const Work w = [] {
    Work s;
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/vitlens-fuzz-folder-XXXXXX";
    if (!::mkdtemp(&tmpl[0])) std::abort();
    s.base = tmpl;
    s.root = s.base + "/data";
    s.outside = s.base + "/outside";  // never read through a folder link
    fs::create_directories(s.outside + "/o");
    if (!cv::imencode(".png", cv::Mat(4, 4, CV_8UC3, cv::Scalar(10, 20, 30)), s.png)) std::abort();
    for (const char* name : {"/x.png", "/o/y.png"}) {
      std::FILE* f = std::fopen((s.outside + name).c_str(), "wb");
      if (!f || std::fwrite(s.png.data(), 1, s.png.size(), f) != s.png.size() || std::fclose(f) != 0) std::abort();
    }
    return s;
  }();
  return w;
}

bool write_file(const std::string& path, const unsigned char* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wbx");  // never through a link the input made
  if (!f) return false;
  const bool ok = (size == 0 || std::fwrite(data, 1, size, f) == size);
  return std::fclose(f) == 0 && ok;
}

std::string parent_real(const std::string& path) {
  char* real = ::realpath(fs::path(path).parent_path().c_str(), nullptr);
  if (!real) std::abort();  // a listed file's folder always resolves
  std::string out = real;
  std::free(real);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const char* const kDirNames[] = {"a", "b", "c", ".h", "sub", "l"};
  static const char* const kFileNames[] = {"1.png", "2.jpg", ".x.png", "l", "3.png", "a"};
  const Work& w = work();
  // Registered after `w` is made, so it runs before `w` is destroyed: removes links, never their targets.
  static const bool cleanup = std::atexit([] {
    std::error_code ec;
    fs::remove_all(work().base, ec);
  }) == 0;
  (void)cleanup;
  std::error_code ec;
  fs::remove_all(w.root, ec);  // removes links, never what they point to
  if (!fs::create_directory(w.root, ec)) std::abort();
  std::vector<std::string> dirs{w.root}, made;
  long entries = 0;  // what the tree holds: the most entries a walk that reads each folder once reads
  size_t at = 0;
  auto next = [&]() -> unsigned { return at < size ? data[at++] : 0u; };
  for (int step = 0; step < 48 && at + 2 <= size; ++step) {
    const unsigned what = next() % 6, arg = next();
    const std::string parent = dirs[arg % dirs.size()];
    std::string path = parent + "/" + (what == 0 ? kDirNames : kFileNames)[(arg / 8) % 6];
    bool ok = false;
    switch (what) {
      case 0:
        ok = ::mkdir(path.c_str(), 0755) == 0;
        if (ok) dirs.push_back(path);
        break;
      case 1:
        ok = write_file(path, w.png.data(), w.png.size());
        break;
      case 2: {
        const size_t n = std::min<size_t>(next() % 32, size - at);
        ok = write_file(path, data + at, n);
        at += n;
        break;
      }
      case 3: {
        if (next() & 1) path = parent + "/" + kDirNames[(arg / 8) % 6];
        const unsigned pick = next();
        const std::vector<std::string> targets = {".", "..", "../..", "/", w.outside, w.outside + "/x.png",
                                                  "nowhere", fs::path(path).filename().string(), w.base};
        std::string target = targets[pick % targets.size()];
        if (pick >= 128 && !made.empty()) target = made[pick % made.size()];  // anything made so far
        ok = ::symlink(target.c_str(), path.c_str()) == 0;
        break;
      }
      case 4:
        ok = !made.empty() && ::link(made[arg % made.size()].c_str(), path.c_str()) == 0;
        break;
      default:
        ok = ::mkfifo(path.c_str(), 0644) == 0;
        break;
    }
    if (ok) {
      ++entries;
      made.push_back(path);
    }
  }

  char* root_real_c = ::realpath(w.root.c_str(), nullptr);
  if (!root_real_c) std::abort();
  const std::string root_real = root_real_c;
  std::free(root_real_c);
  try {
    vitlens::DataWalker walker(w.root, 10000);
    const vitlens::FolderWalk walk = walker.walk(w.root, true);
    if (walker.entries_read() > entries) std::abort();  // a folder read twice, or one outside
    std::set<std::pair<dev_t, ino_t>> seen;
    for (const std::string& file : walk.files) {
      struct stat st {};
      if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) std::abort();
      if (!seen.insert({st.st_dev, st.st_ino}).second) std::abort();  // a file listed twice
      const std::string folder = parent_real(file);
      if (folder != root_real && folder.rfind(root_real + "/", 0) != 0) std::abort();  // read outside
    }
  } catch (const vitlens::Error&) {
  }
  vitlens::FolderReport report;
  try {
    (void)vitlens::load_image_folder(w.root, 4, &report);
  } catch (const vitlens::Error&) {
  }
  try {
    (void)vitlens::load_photo_corpus(w.root, 8, &report);
  } catch (const vitlens::Error&) {
  }
  return 0;
}
