// Whole-or-nothing output files: temporary in the same folder, flushed, renamed over the target.
#include "vitlens/files.hpp"

#include <cerrno>
#include <cstring>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "vitlens/error.hpp"

namespace vitlens {

namespace {

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string file_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

void require_writable_dir(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) throw Error(dir + ": output folder does not exist");
  if (!S_ISDIR(st.st_mode)) throw Error(dir + ": output path is not a folder");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) throw Error(dir + ": output folder is not writable");
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string dir = parent_dir(path);
  std::string tmpl = dir + "/." + file_name(path) + ".tmp-XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  if (fd < 0) throw Error(path + ": cannot create a file in " + dir + " (" + std::strerror(errno) + ")");
  const std::string tmp(name.data());
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(path + ": " + what + " failed (" + std::strerror(err) + "); nothing was written");
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd, 0644) != 0) fail("chmod");
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": close failed (" + std::strerror(err) + "); nothing was written");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": rename failed (" + std::strerror(err) + "); nothing was written");
  }
}

void write_png_atomic(const std::string& path, const cv::Mat& rgb8) {
  cv::Mat to_encode;
  if (rgb8.type() == CV_8UC3) cv::cvtColor(rgb8, to_encode, cv::COLOR_RGB2BGR);
  else if (rgb8.type() == CV_8UC1) to_encode = rgb8;
  else throw Error(path + ": internal: PNG export expects 8-bit RGB or gray");
  std::vector<unsigned char> buf;
  if (!cv::imencode(".png", to_encode, buf)) throw Error(path + ": PNG encoding failed");
  write_file_atomic(path, std::string(buf.begin(), buf.end()));
}

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
  out.reserve(10 + header.size() + count * 4);
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
