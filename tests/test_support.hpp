#pragma once
// Shared helpers for the tests: random models built in memory, temporary folders, a photo folder.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>

#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "models/bundled.hpp"
#include "core/cpu/fast_attention.hpp"
#include "models/model_io.hpp"
#include "core/train/train_ops.hpp"

// Defined when a sanitizer's allocator (address, leak, thread, memory) is in use: it ignores
// mallopt and reserves terabytes of address space, so no test can limit RLIMIT_AS under it.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define VITLENS_TEST_SANITIZER_ALLOCATOR 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define VITLENS_TEST_SANITIZER_ALLOCATOR 1
#endif

namespace vitlens::test {
// Resident memory a sanitizer's allocator adds to a run, allowed on top of the tight peak-memory
// bounds: ASan's quarantine keeps up to 256 MB of freed blocks (quarantine_size_mb), plus redzones.
// The Release build holds the bounds exactly.
#ifdef VITLENS_TEST_SANITIZER_ALLOCATOR
constexpr long kSanitizerSlackMb = 256;
#else
constexpr long kSanitizerSlackMb = 0;
#endif
}  // namespace vitlens::test

namespace vitlens::test {

// The instruction sets this CPU runs, portable first: the builds of the kernels and of the
// training ops a test compares (set_kernel_isa() selects both, cpu.hpp). Each one the CPU lacks
// is said once per test binary on stderr, with the reason, so a run on a narrower machine shows
// what it did not test.
inline std::vector<KernelIsa> isas_here() {
  static const bool said = [] {
    for (KernelIsa isa : kAllKernelIsas)
      if (!kernel_isa_supported(isa))
        std::fprintf(stderr, "skipping the %s kernels: %s\n", kernel_isa_name(isa), kernel_isa_missing(isa).c_str());
    return true;
  }();
  (void)said;
  std::vector<KernelIsa> isas;
  for (KernelIsa isa : kAllKernelIsas)
    if (kernel_isa_supported(isa)) isas.push_back(isa);
  return isas;
}

// train_ops_isa()'s name for the build set_kernel_isa(isa) selects.
inline std::string train_ops_name(KernelIsa isa) { return kernel_isa_id(isa); }

// Puts the kernels in use back when a scope ends (for a test that calls set_kernel_isa itself).
struct IsaGuard {
  KernelIsa saved = kernel_isa();
  ~IsaGuard() { set_kernel_isa(saved); }
};

// Runs the kernels and training ops of `isa` for one scope; those in use before again on the way
// out, also when a REQUIRE leaves early.
struct UseIsa {
  KernelIsa saved = kernel_isa();
  explicit UseIsa(KernelIsa isa) { set_kernel_isa(isa); }
  ~UseIsa() { set_kernel_isa(saved); }
  UseIsa(const UseIsa&) = delete;
  UseIsa& operator=(const UseIsa&) = delete;
};

// The largest difference from a reference over the reference's largest magnitude (the max-norm
// relative error; the plain largest difference when the reference is all zero). got: ref.size() values.
inline double max_norm_rel(const float* got, const std::vector<float>& ref) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

// Every tensor of the config filled with N(0, scale^2) (LayerNorm weights around 1), seeded.
inline TensorMap random_tensors(const VitConfig& config, unsigned seed, float scale = 0.3f) {
  return gaussian_tensors(config, seed, scale);
}

inline VitModel random_model(const VitConfig& config, unsigned seed, float scale = 0.3f) {
  return model_from_tensors(config, random_tensors(config, seed, scale), "random-model");
}

// A small ViT for tests and seeds: `patch` px patches, width `dim`, `heads` heads, `depth` blocks,
// an img x img input, MLP ratio 2; class token and qkv bias as VitConfig's defaults (on).
inline VitConfig vit_config(const std::string& name, int patch, int dim, int heads, int depth, int img) {
  VitConfig c;
  c.name = name;
  c.patch_size = patch;
  c.embed_dim = dim;
  c.num_heads = heads;
  c.depth = depth;
  c.img_h = c.img_w = img;
  c.mlp_ratio = 2.0;
  return c;
}

inline VitConfig small_config(int img = 16, bool class_token = true, int depth = 1) {
  VitConfig c;
  c.name = "test";
  c.description = "random test model";
  c.patch_size = 4;
  c.embed_dim = 48;
  c.num_heads = 4;
  c.depth = depth;
  c.img_h = c.img_w = img;
  c.class_token = class_token;
  return c;
}

// The folders temp_dir made in this process, removed with everything in them when the process
// exits normally (ctest runs each test case in a process of its own; a crash or a timeout leaves
// them), so a test run leaves nothing under /tmp; kept when VITLENS_KEEP_TEST_DIRS is set to any
// value, to look at a failing test's files. A child made by fork() that exits removes none of
// them (they belong to the process that made them). Links are never followed.
class TempDirs {
 public:
  void add(const std::string& dir) {
    std::lock_guard<std::mutex> lock(mutex_);
    dirs_.push_back(dir);
  }
  ~TempDirs() {
    const char* keep = std::getenv("VITLENS_KEEP_TEST_DIRS");
    if (::getpid() != owner_ || keep) return;
    namespace fs = std::filesystem;
    for (const std::string& dir : dirs_) {
      std::error_code status_error, walk_error, ignored;
      if (fs::symlink_status(dir, status_error).type() != fs::file_type::directory) continue;  // gone, or not ours
      // A test may have left folders read-only or closed (refused writes): the top first, so the
      // walk can enter it, then every folder below, so remove_all can empty them.
      fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add, ignored);
      for (fs::recursive_directory_iterator it(dir, walk_error), end; !walk_error && it != end;
           it.increment(walk_error))
        if (it->symlink_status(ignored).type() == fs::file_type::directory)
          fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ignored);
      fs::remove_all(dir, ignored);
      if (ignored)
        std::fprintf(stderr, "test_support: could not remove %s: %s\n", dir.c_str(), ignored.message().c_str());
    }
  }

 private:
  const pid_t owner_ = ::getpid();
  std::mutex mutex_;
  std::vector<std::string> dirs_;
};

inline TempDirs& temp_dirs() {
  static TempDirs dirs;
  return dirs;
}

// A fresh empty folder under $TMPDIR (or /tmp), removed at exit (TempDirs) or earlier by the caller.
inline std::string temp_dir(const std::string& tag) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/vitlens-" + tag + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  temp_dirs().add(buf.data());
  return buf.data();
}

// A few opencv-doc photos, copied at run time into a temporary folder (never into the repository),
// one of them in a subfolder (photos are read recursively), plus a file that is not an image
// (skipped and counted): baboon, fruits, building, home, butterfly, sub/messi5 and notes.txt.
inline std::string photo_folder(const std::string& tag) {
  const std::string photos = "/usr/share/doc/opencv-doc/examples/data/";
  const std::string dir = temp_dir(tag);
  ::mkdir((dir + "/sub").c_str(), 0755);
  for (const char* name : {"baboon.jpg", "fruits.jpg", "building.jpg", "home.jpg", "butterfly.jpg", "sub/messi5.jpg"}) {
    const std::string file = name;
    std::ifstream in(photos + file.substr(file.find('/') + 1), std::ios::binary);
    if (!in)
      throw std::runtime_error("opencv-doc's example photos are missing from " + photos +
                               " (scripts/setup.sh installs opencv-doc)");
    std::ofstream out(dir + "/" + file, std::ios::binary);
    out << in.rdbuf();
  }
  std::ofstream(dir + "/notes.txt") << "not an image\n";
  return dir;
}

}  // namespace vitlens::test
