// The output folder itself (files.hpp): its lock, a process's claim on it, listing it, the private
// folders and temporaries of this process, and tidying it: completing this user's interrupted
// commits and removing stale temporaries, while anything of another user in a shared folder, or of
// our names but not ours, is skipped with a one-line warning, so nothing in a shared folder blocks
// the next export.
//
// Index
//   [SECTION] Folder lock, claim and listing
//   [SECTION] Temporaries and private folders
//   [SECTION] Tidy
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "core/io/files_internal.hpp"
#include "core/io/paths.hpp"

namespace vitlens {

namespace files_internal {

// =============================================================================================
// [SECTION] Folder lock, claim and listing
// =============================================================================================
FolderLock::FolderLock(const std::string& dir) {
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) throw Error(dir + ": cannot open the output folder (" + errno_text(errno) + ")");
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    ::close(fd_);
    throw Error(dir + ": cannot lock the output folder (" + errno_text(err) + ")");
  }
}

FolderLock::FolderLock(const std::string& dir, std::nothrow_t) {
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) return;
  // A commit holds the lock for a few renames; a holder that keeps it longer (a process stopped
  // mid-commit, another user's) is not waited for.
  const auto deadline = std::chrono::steady_clock::now() + kBriefLockWait;
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK || std::chrono::steady_clock::now() >= deadline) {
      ::close(fd_);
      fd_ = -1;
      return;
    }
    const timespec pause{0, 1000000};
    ::nanosleep(&pause, nullptr);
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace files_internal

FolderClaim::FolderClaim(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) throw Error(dir + ": cannot claim the folder (" + files_internal::errno_text(errno) + ")");
  if (!S_ISDIR(st.st_mode)) throw Error(dir + ": not a folder");
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  // Abstract name: a leading NUL, then text; its length is passed, no terminating NUL.
  char name[64];
  const int length = std::snprintf(name, sizeof name, "vitlens-folder-%llx-%llx",
                                   static_cast<unsigned long long>(st.st_dev), static_cast<unsigned long long>(st.st_ino));
  std::memcpy(address.sun_path + 1, name, static_cast<size_t>(length));
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;  // no socket: nothing to claim with (held() says so)
  const auto size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + static_cast<size_t>(length));
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), size) == 0) {
    fd_ = fd;
    return;
  }
  const int err = errno;
  ::close(fd);
  if (err == EADDRINUSE)
    throw FolderBusy(dir + ": another vitlens process is training or saving in this folder");
  // Any other refusal (a sandbox's policy, no descriptors left): the claim holds nothing (held()),
  // rather than stopping the work.
}

FolderClaim::~FolderClaim() {
  if (fd_ >= 0) ::close(fd_);
}

namespace files_internal {

std::vector<std::string> list_names(int dir_fd) {
  std::vector<std::string> names;
  const int fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return names;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    ::close(fd);
    return names;
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

bool read_at(int dir_fd, const std::string& name, std::string& out, size_t max_bytes) {
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<unsigned long long>(st.st_size) > max_bytes) {
    ::close(fd);
    errno = EFBIG;  // not read as a record: too large or not a regular file
    return false;
  }
  out.clear();
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return false;
    }
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {  // grew since fstat
      ::close(fd);
      errno = EFBIG;
      return false;
    }
  }
  ::close(fd);
  return true;
}

void remove_tree_at(int dir_fd, const std::string& name) {
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    for (const std::string& entry : list_names(fd)) ::unlinkat(fd, entry.c_str(), 0);
    ::close(fd);
    ::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR);
  } else {
    ::unlinkat(dir_fd, name.c_str(), 0);
  }
}

// =============================================================================================
// [SECTION] Temporaries and private folders
// =============================================================================================
std::string temp_template(const std::string& dir) {
  return dir + "/" + kTempPrefix + std::to_string(::getpid()) + "-XXXXXX";
}

int hold_temp(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void release_temp(int& slot, int& hold) {
  unregister_temp(slot);
  slot = -1;
  if (hold >= 0) ::close(hold);
  hold = -1;
}

// A private folder in `dir` (a temporary, registered for the signal cleanup in `slot`, held by
// `hold`); returns its name.
std::string make_private_folder(const std::string& dir, int& slot, int& hold, const std::string& what) {
  std::string tmpl = temp_template(dir);
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  {
    // Made and held with the folder locked: a tidy (which runs locked) never sees it unheld.
    FolderLock lock(dir);
    const CriticalSection created_and_registered;
    if (!::mkdtemp(name.data())) throw Error(dir + ": cannot create a folder for " + what + " (" + errno_text(errno) + ")");
    slot = register_temp(name.data());
    hold = hold_temp(name.data());
  }
  return base_name(name.data());
}

// Unique per process and call: "<nanoseconds since the epoch, 16 hex digits>-<pid>-<the private
// folder's random part>"; the fixed-width time first sorts names by age.
std::string unique_id(const std::string& private_name) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count();
  char time_hex[17];
  std::snprintf(time_hex, sizeof time_hex, "%016llx", static_cast<unsigned long long>(ns));
  return std::string(time_hex) + "-" + std::to_string(::getpid()) + "-" + private_name.substr(private_name.size() - 6);
}

// =============================================================================================
// [SECTION] Tidy
// =============================================================================================
namespace {

// An interrupted commit left in the folder: completed when it is this user's; anything else of
// a commit folder's name (another user's set, a file, a folder that is not a set, a set that
// cannot be completed) is skipped with a one-line warning, never an error for this export.
bool complete_interrupted(int dir_fd, const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return false;  // gone meanwhile
  if (!S_ISDIR(st.st_mode)) {
    warn(path + ": not an export of vitlens (not a folder); left alone");
    return false;
  }
  if (st.st_uid != ::geteuid()) {
    warn(path + ": another user's (uid " + std::to_string(st.st_uid) +
         "); if it is an interrupted export, only that user's next export can complete it; skipped");
    return false;
  }
  try {
    finish_commit(dir_fd, dir, name, true);
    return true;
  } catch (const Error& e) {
    warn(std::string(e.what()) + "; this interrupted export is skipped");
    return false;
  }
}

bool is_temp_name(const std::string& name, long& pid) {
  const size_t prefix = sizeof kTempPrefix - 1;
  if (name.compare(0, prefix, kTempPrefix) != 0) return false;
  const size_t dash = name.find('-', prefix);
  if (dash == std::string::npos || dash == prefix || dash - prefix > 10 || name.size() != dash + 7) return false;
  for (size_t i = prefix; i < dash; ++i)
    if (name[i] < '0' || name[i] > '9') return false;
  for (size_t i = dash + 1; i < name.size(); ++i)
    if (!std::isalnum(static_cast<unsigned char>(name[i]))) return false;
  pid = std::stol(name.substr(prefix, dash - prefix));
  return true;
}

// Whether another open file description holds an flock on the temporary `name`: its process is
// working on it (hold_temp). Unknown where it cannot be opened or the file system takes no flock.
enum class Hold { Held, Free, Unknown };
Hold temp_hold(int dir_fd, const std::string& name) {
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return Hold::Unknown;
  const Hold hold = ::flock(fd, LOCK_EX | LOCK_NB) == 0 ? Hold::Free
                    : errno == EWOULDBLOCK                ? Hold::Held
                                                          : Hold::Unknown;
  ::close(fd);  // lets go of the lock this took, if it took one
  return hold;
}

bool is_set_name(const std::string& name) {
  const size_t prefix = sizeof kSetPrefix - 1;
  if (name.compare(0, prefix, kSetPrefix) != 0 || name.size() == prefix) return false;
  for (size_t i = prefix; i < name.size(); ++i)
    if (!std::isalnum(static_cast<unsigned char>(name[i])) && name[i] != '-') return false;
  return true;
}

}  // namespace

// With the folder locked: completes this user's interrupted commits, removes stale temporaries:
// those no process holds whose process is gone or which are older than kStaleTempMinutes.
int tidy_locked(int dir_fd, const std::string& dir) {
  int done = finish_groups(dir_fd, dir);
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  for (const std::string& name : list_names(dir_fd)) {
    long pid = 0;
    if (is_set_name(name)) {
      done += complete_interrupted(dir_fd, dir, name);
    } else if (is_temp_name(name, pid)) {
      struct stat st {};
      if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      const bool file_or_folder = S_ISREG(st.st_mode) || S_ISDIR(st.st_mode);
      if (file_or_folder && temp_hold(dir_fd, name) == Hold::Held) continue;  // in use, whatever its PID or age
      const bool gone = pid <= 0 || pid > INT_MAX || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
      const bool old = now - st.st_mtime > kStaleTempMinutes * 60;
      if (gone || old) {
        remove_tree_at(dir_fd, name);
        ++done;
      }
    }
  }
  return done;
}

}  // namespace files_internal

using namespace files_internal;

int tidy_output_dir(const std::string& dir) {
  FolderLock lock(dir);
  const CriticalSection no_signals;
  return tidy_locked(lock.fd(), dir);
}

}  // namespace vitlens
