// libFuzzer harness: the Fashion-MNIST IDX reader (load_fashion_mnist: the files read whole, gzip
// inflated header first and then only as far as the header announces, magic, dimensions, sizes,
// the two files' counts, labels). Input: one flag byte (bit 0: the images file is named .gz, bit 1:
// the labels file is), a 16-bit little-endian length L, L bytes of the images file, the rest is
// the labels file. Written into a temporary folder, then read with limit 0 and limit 2.
// Any input may be refused with vitlens::Error; anything else is a finding. README "Fuzzing".
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <unistd.h>

#include "core/data/dataset.hpp"
#include "core/base/error.hpp"

namespace {

const std::string& work_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/vitlens-fuzz-idx-XXXXXX";
    if (!::mkdtemp(&tmpl[0])) std::abort();
    return tmpl;
  }();
  return dir;
}

void remove_inputs() {
  for (const char* name : {"/t10k-images-idx3-ubyte", "/t10k-images-idx3-ubyte.gz", "/t10k-labels-idx1-ubyte",
                           "/t10k-labels-idx1-ubyte.gz"})
    ::unlink((work_dir() + name).c_str());
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  if (std::fclose(f) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const unsigned flags = data[0];
  const size_t images_size = std::min<size_t>(data[1] | (size_t{data[2]} << 8), size - 3);
  const std::string& dir = work_dir();
  const std::string images = dir + "/t10k-images-idx3-ubyte", labels = dir + "/t10k-labels-idx1-ubyte";
  // Registered after work_dir() is made, so it runs before that string is destroyed.
  static const bool cleanup = std::atexit([] {
    remove_inputs();
    ::rmdir(work_dir().c_str());
  }) == 0;
  (void)cleanup;
  remove_inputs();
  write_file(images + ((flags & 1) ? ".gz" : ""), data + 3, images_size);
  write_file(labels + ((flags & 2) ? ".gz" : ""), data + 3 + images_size, size - 3 - images_size);
  for (int limit : {0, 2}) {
    try {
      const vitlens::ImageSet set = vitlens::load_fashion_mnist(dir, false, limit);
      // What a loaded set promises: one label per image, every pixel in [0, 1], labels 0 to 9.
      if (set.pixels.size() != static_cast<size_t>(set.size()) * 3 * set.height * set.width) std::abort();
      for (int32_t label : set.labels)
        if (label < 0 || label >= 10) std::abort();
      for (float v : set.pixels)
        if (!(v >= 0.0f && v <= 1.0f)) std::abort();
    } catch (const vitlens::Error&) {
      // malformed, truncated, damaged gzip, counts that disagree: refused with a message, which is fine
    }
  }
  return 0;
}
