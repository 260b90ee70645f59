// One output file written whole or not at all (write_file_atomic: a temporary in the same folder,
// flushed, renamed over the target), the bytes of the formats vitlens writes (PNG, .npy), and the
// descriptor writer that export sets and file groups fill their files with. Reading files whole
// belongs here too. The protocol for sets of files is in files.hpp; where each part lives is in
// files_internal.hpp.
//
// Index
//   [SECTION] Writing one file through a descriptor
//   [SECTION] Writing one file whole
//   [SECTION] Reading one file whole
//   [SECTION] File formats
#include "core/io/files.hpp"

#include <cerrno>
#include <cstring>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "core/base/error.hpp"
#include "core/io/files_internal.hpp"
#include "core/io/paths.hpp"

namespace vitlens {

namespace files_internal {

// =============================================================================================
// [SECTION] Writing one file through a descriptor
// =============================================================================================
namespace {

class FdSink : public FileSink {
 public:
  FdSink(int fd, std::string what) : fd_(fd), what_(std::move(what)) {}
  void write(const void* data, size_t size) override {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw Error(what_ + ": write failed (" + errno_text(errno) + ")");
      }
      p += n;
      size -= static_cast<size_t>(n);
    }
  }

 private:
  int fd_;
  std::string what_;
};

// Fills the open file `fd`, flushes it to disk and closes it (always, also on failure). `what`
// names the final path in errors.
void fill_and_close(int fd, const std::string& what, const std::function<void(FileSink&)>& fill) {
  auto fail = [&](const char* step) {
    const int err = errno;
    ::close(fd);
    throw Error(what + ": " + step + " failed (" + errno_text(err) + ")");
  };
  try {
    FdSink sink(fd, what);
    fill(sink);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (injected_failure()) {
    errno = ENOSPC;
    fail("write");
  }
  if (::fchmod(fd, 0644) != 0) fail("chmod");
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    const int err = errno;
    throw Error(what + ": close failed (" + errno_text(err) + ")");
  }
}

}  // namespace

// Creates `path` (a new file in a private folder) and fills it; a failed write removes it.
void write_new_file(const std::string& path, const std::string& what, const std::function<void(FileSink&)>& fill) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(what + ": cannot create (" + errno_text(errno) + ")");
  try {
    fill_and_close(fd, what, fill);
  } catch (const Error&) {
    ::unlink(path.c_str());
    throw;
  }
}

}  // namespace files_internal

using namespace files_internal;

// =============================================================================================
// [SECTION] Writing one file whole
// =============================================================================================
void require_writable_dir(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) throw Error(dir + ": output folder does not exist");
  if (!S_ISDIR(st.st_mode)) throw Error(dir + ": output path is not a folder");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) throw Error(dir + ": output folder is not writable");
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  install_cleanup_handlers();
  const std::string dir = parent_dir(path);
  std::string tmpl = temp_template(dir);
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  int fd = -1, slot = -1, hold = -1;
  {
    // Made and held with the folder locked where that can be done at once (a folder that cannot be
    // opened for reading, or is locked for long, still takes the file): a tidy then never sees it
    // unheld.
    const FolderLock lock(dir, std::nothrow);
    const CriticalSection created_and_registered;
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) {
      slot = register_temp(name.data());
      hold = hold_temp(name.data());
    }
  }
  if (fd < 0) throw Error(path + ": cannot create a file in " + dir + " (" + errno_text(errno) + ")");
  const std::string tmp(name.data());
  try {
    fill_and_close(fd, path, [&](FileSink& sink) { sink.write(bytes.data(), bytes.size()); });
    if (rename_at(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str()) != 0)
      throw Error(path + ": rename failed (" + errno_text(errno) + ")");
  } catch (const Error& e) {
    ::unlink(tmp.c_str());
    release_temp(slot, hold);
    throw Error(std::string(e.what()) + "; nothing was written");
  }
  release_temp(slot, hold);
}

std::vector<unsigned char> png_bytes(const cv::Mat& rgb8, const std::string& what) {
  cv::Mat to_encode;
  if (rgb8.type() == CV_8UC3) cv::cvtColor(rgb8, to_encode, cv::COLOR_RGB2BGR);
  else if (rgb8.type() == CV_8UC1) to_encode = rgb8;
  else throw Error(what + ": internal: PNG export expects 8-bit RGB or gray");
  std::vector<unsigned char> buf;
  if (!cv::imencode(".png", to_encode, buf)) throw Error(what + ": PNG encoding failed");
  return buf;
}

void write_png_atomic(const std::string& path, const cv::Mat& rgb8) {
  const std::vector<unsigned char> buf = png_bytes(rgb8, path);
  write_file_atomic(path, std::string(buf.begin(), buf.end()));
}

// =============================================================================================
// [SECTION] Reading one file whole
// =============================================================================================
// Whole MiB, or bytes below one.
std::string mebibytes(uint64_t bytes) {
  return bytes < (1u << 20) ? std::to_string(bytes) + " bytes" : std::to_string(bytes >> 20) + " MiB";
}

std::optional<std::string> file_stamp(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return std::nullopt;
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
         std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
}

namespace {

// What a failed stat or open of `path` means, in words (errno as they left it).
std::string open_failure(int error) {
  switch (error) {
    case ENOENT: return "no such file";
    case ELOOP: return "a loop of symbolic links";
    case EACCES: return "permission denied";
    case ENOTDIR: return "a part of the path is not a folder";
    case ENAMETOOLONG: return "the name is too long";
    default: return std::strerror(error);
  }
}

// A path that is not a regular file, named for what it is.
std::string not_a_file(const struct stat& st) {
  if (S_ISFIFO(st.st_mode)) return "is a pipe (FIFO), not a regular file";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "is a device, not a regular file";
  if (S_ISSOCK(st.st_mode)) return "is a socket, not a regular file";
  return "is not a regular file";
}

}  // namespace

InputFile::InputFile(const std::string& path, const std::string& kind, uint64_t max_bytes) : path_(path) {
  {  // before opening: opening a pipe would wait for a writer
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw Error(path + ": cannot open " + kind + " (" + open_failure(errno) + ")");
    if (S_ISDIR(st.st_mode)) throw Error(path + ": is a folder, not " + kind);
    if (!S_ISREG(st.st_mode)) throw Error(path + ": " + not_a_file(st) + " (" + kind + " was expected)");
  }
  // O_NONBLOCK: a file swapped for a pipe after the check above is opened without waiting, and
  // refused by the fstat below.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) throw Error(path + ": cannot open " + kind + " (" + open_failure(errno) + ")");
  struct stat st {};
  std::string refusal;
  if (::fstat(fd_, &st) != 0) refusal = path + ": cannot read " + kind + " (" + std::strerror(errno) + ")";
  else if (S_ISDIR(st.st_mode)) refusal = path + ": is a folder, not " + kind;
  else if (!S_ISREG(st.st_mode)) refusal = path + ": " + not_a_file(st) + " (" + kind + " was expected)";
  else if (static_cast<uint64_t>(st.st_size) > max_bytes)
    refusal = path + ": " + mebibytes(static_cast<uint64_t>(st.st_size)) + " is larger than any " +
              kind.substr(kind.find(' ') + 1) + " vitlens can use (at most " + mebibytes(max_bytes) +
              "); nothing was read";
  if (!refusal.empty()) {
    ::close(fd_);
    throw Error(refusal);
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() { ::close(fd_); }

void InputFile::read_at(uint64_t offset, void* dst, size_t count) const {
  auto* out = static_cast<char*>(dst);
  size_t done = 0;
  while (done < count) {
    const ssize_t n = ::pread(fd_, out + done, count - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(path_ + ": read error (" + std::string(std::strerror(errno)) + ")");
    }
    if (n == 0)
      throw Error(path_ + ": the file shrank while it was read (" + std::to_string(offset + done) + " of " +
                  std::to_string(size_) + " bytes)");
    done += static_cast<size_t>(n);
  }
}

std::string read_whole_file(const std::string& path, const std::string& kind, uint64_t max_bytes) {
  const InputFile file(path, kind, max_bytes);
  std::string bytes;
  try {
    bytes.resize(static_cast<size_t>(file.size()));
  } catch (const std::bad_alloc&) {
    throw Error(path + ": not enough memory to read " + kind + " of " + mebibytes(file.size()));
  }
  file.read_at(0, bytes.data(), bytes.size());
  return bytes;
}

// =============================================================================================
// [SECTION] File formats
// =============================================================================================
std::string npy_bytes_f32(const std::vector<size_t>& shape, const float* data) {
  static_assert(sizeof(float) == 4, "float32");
  std::ostringstream dict;
  dict << "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  size_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict << shape[i] << (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
    count *= shape[i];
  }
  dict << "), }";
  std::string header = dict.str();
  // magic (6) + version (2) + header length (2) + header, padded with spaces and a final '\n' so
  // the data starts on a 64-byte boundary (numpy's format 1.0).
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out;
  out.reserve(10 + header.size() + (data ? count * 4 : 0));
  out.append("\x93NUMPY", 6);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>((header.size() >> 8) & 0xff));
  out += header;
  if (data) out.append(reinterpret_cast<const char*>(data), count * 4);  // x86-64 is little-endian
  return out;
}

}  // namespace vitlens
