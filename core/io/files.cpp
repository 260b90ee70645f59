// Whole-or-nothing output files and file sets; temporaries removed on SIGINT / SIGTERM and, when
// a process was killed, by the next run into the same folder. The protocol is in files.hpp.
//
// Index
//   [SECTION] Signal cleanup registry (async-signal-safe)
//   [SECTION] Failure injection
//   [SECTION] Warnings
//   [SECTION] Writing one file through a descriptor
//   [SECTION] Folder lock, commit and tidy
//   [SECTION] File groups: commit and completion
//   [SECTION] Public functions
//   [SECTION] File groups
//   [SECTION] Reading a whole file
#include "core/io/files.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "core/base/error.hpp"

namespace vitlens {

namespace {

const char kTempPrefix[] = ".vitlens-tmp-";  // + <pid>-XXXXXX
const char kSetPrefix[] = ".vitlens-set-";   // + <set id>
const char kGroupPrefix[] = ".vitlens-group-";  // + <time>-<pid>-<random>: a committed FileGroup
const char kRecordFile[] = ".record";        // inside a commit folder: the record, moved last
const char kNameFile[] = ".name";            // inside a commit folder: the record's final name
const char kReplacesFile[] = ".replaces";    // inside a commit folder: the set id of the record it replaces
const char kForceFile[] = ".force";          // inside a commit folder: the set may replace foreign files
constexpr size_t kMaxRecordBytes = 16 << 20;  // ours are kilobytes: a larger file is not read as a record

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string errno_text(int err) { return std::strerror(err); }

// =============================================================================================
// [SECTION] Signal cleanup registry (async-signal-safe)
// =============================================================================================
// A fixed table of paths (no allocation in the handler). A slot is claimed with a compare-and-
// swap, filled, then published; the handler only reads published slots. A path is a temporary
// file or a private folder; folders are emptied with getdents64 + unlinkat, which are plain
// system calls (opendir/readdir allocate and are not async-signal-safe).
constexpr int kSlots = 64;
struct Slot {
  std::atomic<int> state{0};  // 0 free, 1 being filled, 2 published
  char path[PATH_MAX];
};
Slot g_slots[kSlots];
// Critical sections in progress (creating and registering a temporary, a commit): a handler,
// which may run on any thread of the process, waits for them to finish.
std::atomic<int> g_critical{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler reads these atomics");

int register_temp(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (g_slots[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
      g_slots[i].state.store(2);
      return i;
    }
  }
  return -1;  // table full: a leftover is still removed by the next run's tidy
}

void unregister_temp(int slot) {
  if (slot >= 0) g_slots[slot].state.store(0);
}

void remove_tree_signal_safe(const char* path) {
  if (::unlink(path) == 0 || errno == ENOENT) return;
  const int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    // Our private folders hold plain files only. Deleting while listing may hide entries from the
    // listing, so the folder is listed again from the start until nothing is left.
    for (int pass = 0; pass < 8; ++pass) {
      ::lseek(fd, 0, SEEK_SET);
      bool removed = false;
      alignas(8) char buf[4096];
      long n;
      while ((n = ::syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n;) {
          // struct linux_dirent64: u64 d_ino, s64 d_off, u16 d_reclen, u8 d_type, char d_name[]
          unsigned short reclen = 0;
          std::memcpy(&reclen, buf + off + 16, sizeof reclen);
          const char* name = buf + off + 19;
          const bool dots = name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
          if (!dots && ::unlinkat(fd, name, 0) == 0) removed = true;
          off += reclen;
        }
      }
      if (!removed) break;
    }
    ::close(fd);
  }
  ::rmdir(path);
}

extern "C" void cleanup_on_signal(int sig) {
  const int saved_errno = errno;
  // A critical section blocks these signals on its own thread; delivered on another thread, wait
  // for it, so a set is never left half moved into place (a commit is a few renames) and a
  // temporary is never left created but not yet registered.
  while (g_critical.load() > 0) {
    const timespec pause{0, 1000000};
    ::nanosleep(&pause, nullptr);
  }
  for (int i = 0; i < kSlots; ++i) {
    Slot& slot = g_slots[i];
    if (slot.state.load() != 2) continue;
    if (::unlink(slot.path) == 0 || errno == ENOENT) continue;  // a single-file temporary
    // A private folder. Another thread may still be writing into it (the handler runs on any
    // thread): renamed first, the folder takes no new files under its old path, then it is
    // emptied. The new name keeps our pattern (.vitlens-tmp-<pid>-dyiNNN) for the next run's tidy.
    char dying[PATH_MAX];
    const size_t len = std::strlen(slot.path);
    std::memcpy(dying, slot.path, len + 1);
    if (len >= 6) {
      dying[len - 6] = 'd';
      dying[len - 5] = 'y';
      dying[len - 4] = 'i';
      dying[len - 3] = static_cast<char>('0' + i / 100);
      dying[len - 2] = static_cast<char>('0' + i / 10 % 10);
      dying[len - 1] = static_cast<char>('0' + i % 10);
    }
    if (len >= 6 && ::rename(slot.path, dying) == 0) remove_tree_signal_safe(dying);
    else remove_tree_signal_safe(slot.path);
  }
  // Terminate as the signal would have: default action, raised again (delivered on return, as
  // the signal is blocked while its handler runs).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
  errno = saved_errno;
}

const int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Blocks the cleanup signals on this thread for its lifetime: between creating a temporary and
// registering it, and during a commit.
class BlockCleanupSignals {
 public:
  BlockCleanupSignals() {
    sigset_t block;
    sigemptyset(&block);
    for (int sig : kCleanupSignals) sigaddset(&block, sig);
    ::pthread_sigmask(SIG_BLOCK, &block, &saved_);
  }
  ~BlockCleanupSignals() { ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  BlockCleanupSignals(const BlockCleanupSignals&) = delete;
  BlockCleanupSignals& operator=(const BlockCleanupSignals&) = delete;

 private:
  sigset_t saved_{};
};

// ... and marks a critical section in progress, which a handler on another thread waits for.
class CriticalSection {
 public:
  CriticalSection() { g_critical.fetch_add(1); }
  ~CriticalSection() { g_critical.fetch_sub(1); }
  CriticalSection(const CriticalSection&) = delete;
  CriticalSection& operator=(const CriticalSection&) = delete;

 private:
  BlockCleanupSignals blocked_;  // constructed first: the count never rises with signals open
};

// =============================================================================================
// [SECTION] Failure injection
// =============================================================================================
std::atomic<long> g_fail_countdown{0};
std::atomic<int> g_fail_signal{0};

// True for the operation the test asked to fail (counting down from fail_file_operation's n); with
// a signal asked for, the process raises it there instead.
bool injected_failure() {
  long v = g_fail_countdown.load();
  while (v > 0)
    if (g_fail_countdown.compare_exchange_weak(v, v - 1)) {
      if (v == 1 && g_fail_signal.load() != 0) ::raise(g_fail_signal.load());
      return v == 1;
    }
  return false;
}

int rename_at(int from_dir, const char* from, int to_dir, const char* to) {
  if (injected_failure()) {
    errno = ENOSPC;
    return -1;
  }
  return ::renameat(from_dir, from, to_dir, to);
}

// =============================================================================================
// [SECTION] Warnings
// =============================================================================================
std::mutex g_warning_lock;
std::function<void(const std::string&)> g_warning_handler;  // empty: stderr

void warn(const std::string& text) {
  const std::lock_guard<std::mutex> hold(g_warning_lock);
  if (g_warning_handler) g_warning_handler(text);
  else std::fprintf(stderr, "vitlens: warning: %s\n", text.c_str());
}

// =============================================================================================
// [SECTION] Writing one file through a descriptor
// =============================================================================================
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

// =============================================================================================
// [SECTION] Folder lock, commit and tidy
// =============================================================================================
// An exclusive flock on the output folder itself (no lock file in the user's folder): commits
// and tidies into one folder take turns, across processes. Local file systems only (flock).
class FolderLock {
 public:
  explicit FolderLock(const std::string& dir) {
    fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) throw Error(dir + ": cannot open the output folder (" + errno_text(errno) + ")");
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd_);
      throw Error(dir + ": cannot lock the output folder (" + errno_text(err) + ")");
    }
  }
  ~FolderLock() { ::close(fd_); }  // closing releases the lock
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

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

// Reads the regular file `name` (never a link, a FIFO or a device: a user's file of a record's
// name must not block or flood the reader) of at most max_bytes. False, with errno, otherwise.
bool read_at(int dir_fd, const std::string& name, std::string& out, size_t max_bytes = kMaxRecordBytes) {
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

// The file `name` of the folder as JSON; discarded (not an object) when missing, unreadable or not JSON.
nlohmann::json read_json_at(int dir_fd, const std::string& name) {
  std::string bytes;
  if (!read_at(dir_fd, name, bytes)) return nlohmann::json();
  return nlohmann::json::parse(bytes, nullptr, false);
}

// A record vitlens wrote: a JSON object whose kRecordKey is its own file name.
bool is_our_record(const nlohmann::json& j, const std::string& name) {
  return j.is_object() && j.contains(kRecordKey) && j[kRecordKey].is_string() && j[kRecordKey].get<std::string>() == name;
}

// A record's "set" id ("" when it has none or is not JSON).
std::string set_id_of(const std::string& record) {
  const nlohmann::json j = nlohmann::json::parse(record, nullptr, false);
  if (j.is_object() && j.contains("set") && j["set"].is_string()) return j["set"].get<std::string>();
  return "";
}

// The set id of the record `name` in the folder: "" when there is none, "?" when unreadable.
std::string current_set_id(int dir_fd, const std::string& name) {
  std::string record;
  if (!read_at(dir_fd, name, record)) return errno == ENOENT ? "" : "?";
  return set_id_of(record);
}

// The file names a record's "files" array lists (empty when it is missing or not JSON).
std::set<std::string> listed_names(const nlohmann::json& j) {
  std::set<std::string> names;
  if (j.is_object() && j.contains("files") && j["files"].is_array())
    for (const auto& f : j["files"])
      if (f.is_string()) names.insert(base_name(f.get<std::string>()));
  return names;
}

// The names the folder's records prove vitlens wrote: every file a record of ours lists. Reads
// each JSON file of the folder, so it is called only when the record a set replaces does not
// prove a name (a file another mode's record lists, as --layer's <stem>_attn.npy).
std::set<std::string> names_proven_by_folder(int dir_fd) {
  std::set<std::string> proven;
  for (const std::string& name : list_names(dir_fd)) {
    if (name.size() < 6 || name.compare(name.size() - 5, 5, ".json") != 0) continue;
    const nlohmann::json j = read_json_at(dir_fd, name);
    if (!is_our_record(j, name)) continue;
    proven.insert(name);
    for (const std::string& listed : listed_names(j)) proven.insert(listed);
  }
  return proven;
}

// Throws OutputConflict when one of `members` or the record `record_name` cannot be put in place:
// its name is taken by a folder, by another user's file in a shared (sticky) folder (which only
// its owner may replace), or, unless replace_foreign, by a file vitlens cannot prove it wrote.
// Called with the folder locked, before anything is moved.
void check_names(int dir_fd, const std::string& dir, const std::string& record_name,
                 const std::vector<std::string>& members, bool replace_foreign) {
  struct stat dir_st {};
  if (::fstat(dir_fd, &dir_st) != 0) throw Error(dir + ": cannot read the output folder (" + errno_text(errno) + ")");
  const uid_t me = ::geteuid();
  const bool shared = (dir_st.st_mode & S_ISVTX) != 0 && dir_st.st_uid != me && me != 0;
  const nlohmann::json old_record = read_json_at(dir_fd, record_name);
  const bool old_is_ours = is_our_record(old_record, record_name);
  const std::set<std::string> listed = old_is_ours ? listed_names(old_record) : std::set<std::string>{};
  std::optional<std::set<std::string>> folder_proven;  // read once, when first needed
  std::vector<std::string> names = members;
  names.push_back(record_name);
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      throw OutputConflict(path, "cannot be checked (" + errno_text(errno) + ")", false);
    }
    if (S_ISDIR(st.st_mode)) throw OutputConflict(path, "is a folder where this export writes a file", false);
    if (shared && st.st_uid != me)
      throw OutputConflict(path, "belongs to another user (uid " + std::to_string(st.st_uid) +
                                     ") in a shared folder, where only its owner may replace it", false);
    if (replace_foreign) continue;
    bool proven = name == record_name ? old_is_ours : listed.count(name) > 0;
    if (!proven) {
      if (!folder_proven) folder_proven = names_proven_by_folder(dir_fd);
      proven = folder_proven->count(name) > 0;
    }
    if (!proven)
      throw OutputConflict(path, "exists and no record of vitlens here lists it (vitlens did not write it, or a "
                                 "version before records did)", true);
  }
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

bool is_internal_name(const std::string& name) {
  return name == kRecordFile || name == kNameFile || name == kReplacesFile || name == kForceFile;
}

// Moves a complete set from the commit folder `commit_name` into the folder, the record last.
// Idempotent: after an interruption at any step, running it again finishes the same set. With
// `recovering` (another run's interrupted set), the names still to move are checked again
// (check_names), as files may have appeared since. Called with the folder locked. Throws
// vitlens::Error saying what failed; the caller says what happens next.
void finish_commit(int dir_fd, const std::string& dir, const std::string& commit_name, bool recovering) {
  const int set_fd = ::openat(dir_fd, commit_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (set_fd < 0) throw Error(dir + "/" + commit_name + ": cannot open (" + errno_text(errno) + ")");
  auto fail = [&](const std::string& what, int err) {
    ::close(set_fd);
    throw Error(dir + ": moving an export's files into place failed at " + what + " (" + errno_text(err) + ")");
  };
  // A commit folder holds .name until its last step (it is renamed to a temporary before being
  // emptied): without one it is not ours.
  std::string record_name;
  if (!read_at(set_fd, kNameFile, record_name)) {
    ::close(set_fd);
    throw Error(dir + "/" + commit_name + ": not an export of vitlens (it has no " + kNameFile + ")");
  }
  if (record_name.empty() || record_name.find('/') != std::string::npos || is_internal_name(record_name))
    fail(commit_name + "/" + kNameFile, EINVAL);
  // Which set is in place now: the one this commit replaces (move on), this one (only the
  // cleanup is left), or a set committed later by another process while this commit lay
  // interrupted (this older set is dropped: moving the rest of it would mix the two).
  std::string replaces;
  const bool knows_replaced = read_at(set_fd, kReplacesFile, replaces);
  const std::string in_place = current_set_id(dir_fd, record_name);
  const std::string own_id = commit_name.substr(sizeof kSetPrefix - 1);
  if (knows_replaced && in_place != replaces && in_place != own_id) {
    ::close(set_fd);
    remove_tree_at(dir_fd, commit_name);
    ::fsync(dir_fd);
    return;
  }
  std::vector<std::string> members;
  for (const std::string& name : list_names(set_fd))
    if (!is_internal_name(name)) members.push_back(name);
  if (recovering) {
    struct stat st {};
    const bool replace_foreign = ::fstatat(set_fd, kForceFile, &st, AT_SYMLINK_NOFOLLOW) == 0;
    try {
      check_names(dir_fd, dir, record_name, members, replace_foreign);
    } catch (...) {
      ::close(set_fd);
      throw;
    }
  }
  for (const std::string& name : members)
    if (rename_at(set_fd, name.c_str(), dir_fd, name.c_str()) != 0) fail(name, errno);
  std::string record;
  if (read_at(set_fd, kRecordFile, record)) {
    // Files of the previous set that this one does not have (fewer heads, no --raw) would be
    // left beside the new record: remove them, but only when the old record is ours and only
    // names it listed under this stem, before the new record appears.
    const nlohmann::json old_record = read_json_at(dir_fd, record_name);
    if (is_our_record(old_record, record_name)) {
      const std::string stem = record_name.substr(0, record_name.find_last_of('.'));
      const std::set<std::string> keep = listed_names(nlohmann::json::parse(record, nullptr, false));
      for (const std::string& old : listed_names(old_record))
        if (!keep.count(old) && old != record_name && old.compare(0, stem.size() + 1, stem + "_") == 0)
          ::unlinkat(dir_fd, old.c_str(), 0);
    }
    if (rename_at(set_fd, kRecordFile, dir_fd, record_name.c_str()) != 0) fail(record_name, errno);
  }
  // The folder leaves its reserved name before it is emptied (a temporary of this process, which
  // a later tidy removes if this process dies here), so an empty ".vitlens-set-*" is never ours.
  std::string now_named = commit_name;
  const std::string done = kTempPrefix + std::to_string(::getpid()) + "-" +
                           (own_id.size() >= 6 ? own_id.substr(own_id.size() - 6) : std::string("done00"));
  if (::renameat(dir_fd, commit_name.c_str(), dir_fd, done.c_str()) == 0) now_named = done;
  ::unlinkat(set_fd, kReplacesFile, 0);
  ::unlinkat(set_fd, kForceFile, 0);
  ::unlinkat(set_fd, kNameFile, 0);
  ::close(set_fd);
  ::unlinkat(dir_fd, now_named.c_str(), AT_REMOVEDIR);
  ::fsync(dir_fd);
}

// =============================================================================================
// [SECTION] File groups: commit and completion
// =============================================================================================
// A committed group's folder holds its files under their final names; each rename moves one into
// place, so running finish_group again after an interruption moves exactly the rest.
// Exactly the names FileGroup::commit makes: the prefix, then unique_id's "<16 hex digits>-<pid>-
// <6 letters or digits>"; anything else (a user's file that merely starts alike) is not ours.
bool is_group_name(const std::string& name) {
  const size_t prefix = sizeof kGroupPrefix - 1;
  if (name.compare(0, prefix, kGroupPrefix) != 0) return false;
  const std::string id = name.substr(prefix);
  const size_t dash = id.find('-', 17);
  if (id.size() < 26 || id[16] != '-' || dash == std::string::npos || dash == 17 || id.size() != dash + 7) return false;
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    const bool ok = i < 16 ? std::isxdigit(c) != 0 : i == 16 || i == dash ? true : i < dash ? std::isdigit(c) != 0 : std::isalnum(c) != 0;
    if (!ok) return false;
  }
  return true;
}

// Moves the files of the committed group `group_name` into the folder, then removes the group's
// folder. Called with the folder locked.
void finish_group(int dir_fd, const std::string& dir, const std::string& group_name) {
  const int group_fd = ::openat(dir_fd, group_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (group_fd < 0) throw Error(dir + "/" + group_name + ": cannot open (" + errno_text(errno) + ")");
  std::vector<std::string> names = list_names(group_fd);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names)
    if (rename_at(group_fd, name.c_str(), dir_fd, name.c_str()) != 0) {
      const int err = errno;
      ::close(group_fd);
      throw Error(dir + "/" + name + ": moving it into place from " + group_name + " failed (" + errno_text(err) + ")");
    }
  ::close(group_fd);
  // An emptied group folder left behind (a failure or a kill here) is removed by the next call.
  if (!injected_failure()) ::unlinkat(dir_fd, group_name.c_str(), AT_REMOVEDIR);
  ::fsync(dir_fd);
}

// Every committed group in the folder, oldest first (their names begin with the commit time, in
// fixed-width hex), so that the newest files end up in place. Called with the folder locked.
int finish_groups(int dir_fd, const std::string& dir) {
  std::vector<std::string> groups;
  for (const std::string& name : list_names(dir_fd)) {
    struct stat st {};
    if (!is_group_name(name) || ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
      continue;
    // Another user's group in a shared folder is theirs to complete: moving its files would need
    // their permissions, and failing here would block this user's own saves.
    if (st.st_uid != ::geteuid()) {
      warn(dir + "/" + name + ": another user's (uid " + std::to_string(st.st_uid) + "); only that user can complete it; skipped");
      continue;
    }
    groups.push_back(name);
  }
  std::sort(groups.begin(), groups.end());
  int done = 0;
  for (const std::string& name : groups) {
    // One that cannot be completed (a file in its way it may not replace) never blocks later
    // saves or reads: the files in place stay, and a newer group of the same files supersedes it.
    try {
      finish_group(dir_fd, dir, name);
      ++done;
    } catch (const Error& e) {
      warn(std::string(e.what()) + "; this interrupted save is skipped, the files in place are kept");
    }
  }
  return done;
}

// Our committed groups older than `newest` whose remaining files are all among `names`: once
// `newest` is in place, completing them would put older files over newer ones. Removed (they are
// this user's own folders). Called with the folder locked.
void remove_superseded_groups(int dir_fd, const std::string& newest, const std::vector<std::string>& names) {
  for (const std::string& name : list_names(dir_fd)) {
    struct stat st {};
    if (!is_group_name(name) || name >= newest || ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    const int group_fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (group_fd < 0) continue;
    const std::vector<std::string> left = list_names(group_fd);
    ::close(group_fd);
    const bool covered = std::all_of(left.begin(), left.end(), [&](const std::string& n) {
      return std::find(names.begin(), names.end(), n) != names.end();
    });
    if (covered) remove_tree_at(dir_fd, name);
  }
}

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

bool is_set_name(const std::string& name) {
  const size_t prefix = sizeof kSetPrefix - 1;
  if (name.compare(0, prefix, kSetPrefix) != 0 || name.size() == prefix) return false;
  for (size_t i = prefix; i < name.size(); ++i)
    if (!std::isalnum(static_cast<unsigned char>(name[i])) && name[i] != '-') return false;
  return true;
}

// With the folder locked: completes this user's interrupted commits, removes stale temporaries.
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

std::string temp_template(const std::string& dir) {
  return dir + "/" + kTempPrefix + std::to_string(::getpid()) + "-XXXXXX";
}

// A private folder in `dir` (a temporary, registered for the signal cleanup in `slot`); returns
// its name.
std::string make_private_folder(const std::string& dir, int& slot, const std::string& what) {
  std::string tmpl = temp_template(dir);
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  {
    const CriticalSection created_and_registered;
    if (!::mkdtemp(name.data())) throw Error(dir + ": cannot create a folder for " + what + " (" + errno_text(errno) + ")");
    slot = register_temp(name.data());
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

}  // namespace

// =============================================================================================
// [SECTION] Public functions
// =============================================================================================
void install_cleanup_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : kCleanupSignals) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;  // the host's choice
      struct sigaction action {};
      action.sa_handler = cleanup_on_signal;
      sigemptyset(&action.sa_mask);
      for (int other : kCleanupSignals) sigaddset(&action.sa_mask, other);
      ::sigaction(sig, &action, nullptr);
    }
  });
}

void testing::fail_file_operation(long n, int signal) {
  g_fail_signal.store(signal);
  g_fail_countdown.store(n);
}

void set_file_warning_handler(std::function<void(const std::string&)> handler) {
  const std::lock_guard<std::mutex> hold(g_warning_lock);
  g_warning_handler = std::move(handler);
}

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
  int fd = -1, slot = -1;
  {
    const CriticalSection created_and_registered;
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) slot = register_temp(name.data());
  }
  if (fd < 0) throw Error(path + ": cannot create a file in " + dir + " (" + errno_text(errno) + ")");
  const std::string tmp(name.data());
  try {
    fill_and_close(fd, path, [&](FileSink& sink) { sink.write(bytes.data(), bytes.size()); });
    if (rename_at(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str()) != 0)
      throw Error(path + ": rename failed (" + errno_text(errno) + ")");
  } catch (const Error& e) {
    ::unlink(tmp.c_str());
    unregister_temp(slot);
    throw Error(std::string(e.what()) + "; nothing was written");
  }
  unregister_temp(slot);
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

// Each folder is tidied once per process (listing a folder of 100000 files for every image of a
// batch would cost more than the export).
static bool first_set_in(const std::string& dir) {
  static std::mutex lock;
  static std::set<std::pair<dev_t, ino_t>> seen;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return true;
  const std::lock_guard<std::mutex> hold(lock);
  return seen.insert({st.st_dev, st.st_ino}).second;
}

OutputSet::OutputSet(const std::string& dir, bool replace_foreign) : dir_(dir), replace_foreign_(replace_foreign) {
  install_cleanup_handlers();
  if (first_set_in(dir)) tidy_output_dir(dir);
  private_name_ = make_private_folder(dir, slot_, "the export");
  open_ = true;
  id_ = unique_id(private_name_);
}

OutputSet::~OutputSet() {
  if (!open_) return;
  const std::string path = dir_ + "/" + private_name_;
  for (const std::string& name : names_) ::unlink((path + "/" + name).c_str());
  ::unlink((path + "/" + kRecordFile).c_str());
  ::unlink((path + "/" + kNameFile).c_str());
  ::unlink((path + "/" + kReplacesFile).c_str());
  ::unlink((path + "/" + kForceFile).c_str());
  ::rmdir(path.c_str());
  unregister_temp(slot_);
}

void OutputSet::write_member(const std::string& name, const std::function<void(FileSink&)>& fill) {
  if (!open_) throw Error(final_path(name) + ": internal: the export's files were already moved into place");
  names_.push_back(name);
  try {
    write_new_file(dir_ + "/" + private_name_ + "/" + name, final_path(name), fill);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "; no file of this export was written");
  }
}

void OutputSet::add(const std::string& name, const std::string& bytes) {
  write_member(name, [&](FileSink& sink) { sink.write(bytes.data(), bytes.size()); });
}

void OutputSet::add_png(const std::string& name, const cv::Mat& rgb8) {
  const std::vector<unsigned char> buf = png_bytes(rgb8, final_path(name));
  write_member(name, [&](FileSink& sink) { sink.write(buf.data(), buf.size()); });
}

void OutputSet::add_stream(const std::string& name, const std::function<void(FileSink&)>& fill) {
  write_member(name, fill);
}

// A record's bytes: `record` with the paths of `files` ("files"), the set id ("set") and the
// proof that vitlens wrote it (kRecordKey: its own name).
std::string record_bytes(nlohmann::json record, const std::string& name, const std::string& set_id,
                         const std::vector<std::string>& files) {
  record["files"] = files;
  record["set"] = set_id;
  record[kRecordKey] = name;
  // replace: a file name that is not valid UTF-8 must not make the JSON writer throw.
  return record.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void OutputSet::add_record(const std::string& name, nlohmann::json record, size_t first) {
  std::vector<std::string> files;
  for (size_t i = first; i < names_.size(); ++i) files.push_back(final_path(names_[i]));
  add(name, record_bytes(std::move(record), name, id_, files));
}

std::vector<std::string> OutputSet::commit(const std::string& record_name, nlohmann::json record) {
  const std::vector<std::string> members = names_;  // the set's files, before the internal ones
  if (record_name.empty() || record_name.find('/') != std::string::npos || is_internal_name(record_name) ||
      std::find(members.begin(), members.end(), record_name) != members.end())
    throw Error(final_path(record_name) + ": internal: not a record name for this set");
  std::vector<std::string> written;
  for (const std::string& name : members) written.push_back(final_path(name));
  const std::string bytes = record_bytes(std::move(record), record_name, id_, written);
  write_member(kRecordFile, [&](FileSink& sink) { sink.write(bytes.data(), bytes.size()); });
  write_member(kNameFile, [&](FileSink& sink) { sink.write(record_name.data(), record_name.size()); });
  if (replace_foreign_) write_member(kForceFile, [](FileSink&) {});
  FolderLock lock(dir_);
  const CriticalSection no_signals;
  check_names(lock.fd(), dir_, record_name, members, replace_foreign_);
  // The set this one replaces, so that completing it after an interruption never mixes it with
  // a set committed in between (finish_commit).
  write_member(kReplacesFile, [&](FileSink& sink) {
    const std::string replaces = current_set_id(lock.fd(), record_name);
    sink.write(replaces.data(), replaces.size());
  });
  const std::string commit_name = kSetPrefix + id_;
  if (rename_at(lock.fd(), private_name_.c_str(), lock.fd(), commit_name.c_str()) != 0)
    throw Error(final_path(record_name) + ": cannot move the export into place (" + errno_text(errno) +
                "); no file of this export was written");
  // The commit point: the set is complete and on its way into place; the handler must not
  // remove it, and the destructor has nothing left to remove.
  unregister_temp(slot_);
  slot_ = -1;
  open_ = false;
  ::fsync(lock.fd());
  try {
    finish_commit(lock.fd(), dir_, commit_name, false);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "; the next export into this folder completes it");
  }
  written.push_back(final_path(record_name));
  return written;
}

int tidy_output_dir(const std::string& dir) {
  FolderLock lock(dir);
  const CriticalSection no_signals;
  return tidy_locked(lock.fd(), dir);
}

// =============================================================================================
// [SECTION] File groups
// =============================================================================================
FileGroup::FileGroup(const std::string& dir) : dir_(dir) {
  install_cleanup_handlers();
  private_name_ = make_private_folder(dir, slot_, "the new files");
  open_ = true;
  id_ = unique_id(private_name_);
}

FileGroup::~FileGroup() {
  if (!open_) return;
  const std::string path = dir_ + "/" + private_name_;
  for (const std::string& name : names_) ::unlink((path + "/" + name).c_str());
  ::rmdir(path.c_str());
  unregister_temp(slot_);
}

void FileGroup::add_stream(const std::string& name, const std::function<void(FileSink&)>& fill) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
    throw Error(dir_ + "/" + name + ": internal: a group's file is named without a folder");
  if (!open_) throw Error(dir_ + "/" + name + ": internal: the group was already committed");
  names_.push_back(name);
  write_new_file(dir_ + "/" + private_name_ + "/" + name, dir_ + "/" + name, fill);
}

void FileGroup::commit() {
  FolderLock lock(dir_);
  const CriticalSection no_signals;
  // An older group left interrupted goes into place first, so that this one replaces it; our stale
  // temporaries go too (a group is a few files written now and then, so every commit tidies).
  tidy_locked(lock.fd(), dir_);
  // Refused before the commit point, so nothing moves: a folder at one of the names, or another
  // user's file in a shared (sticky) folder, which only its owner may replace.
  struct stat dir_st {};
  if (::fstat(lock.fd(), &dir_st) != 0) throw Error(dir_ + ": cannot read the folder (" + errno_text(errno) + ")");
  const uid_t me = ::geteuid();
  for (const std::string& name : names_) {
    struct stat st {};
    if (::fstatat(lock.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISDIR(st.st_mode)) throw Error(dir_ + "/" + name + ": is a folder; nothing was saved");
    if ((dir_st.st_mode & S_ISVTX) != 0 && st.st_uid != me && me != 0)
      throw Error(dir_ + "/" + name + ": belongs to another user (uid " + std::to_string(st.st_uid) +
                  ") in a shared folder, where only its owner may replace it; nothing was saved");
  }
  const std::string group_name = kGroupPrefix + id_;
  if (rename_at(lock.fd(), private_name_.c_str(), lock.fd(), group_name.c_str()) != 0)
    throw Error(dir_ + ": committing the new files failed (" + errno_text(errno) + ")");
  // The commit point: the group is whole and on its way into place; neither the signal handler
  // nor the destructor may remove it now.
  unregister_temp(slot_);
  slot_ = -1;
  open_ = false;
  committed_ = true;
  ::fsync(lock.fd());
  finish_group(lock.fd(), dir_, group_name);
  remove_superseded_groups(lock.fd(), group_name, names_);
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

// [SECTION] Reading a whole file

// Whole MiB, or bytes below one.
std::string mebibytes(uint64_t bytes) {
  return bytes < (1u << 20) ? std::to_string(bytes) + " bytes" : std::to_string(bytes >> 20) + " MiB";
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

std::string read_whole_file(const std::string& path, const std::string& kind, uint64_t max_bytes) {
  {  // before opening: opening a pipe would wait for a writer
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw Error(path + ": cannot open " + kind + " (" + open_failure(errno) + ")");
    if (S_ISDIR(st.st_mode)) throw Error(path + ": is a folder, not " + kind);
    if (!S_ISREG(st.st_mode)) throw Error(path + ": " + not_a_file(st) + " (" + kind + " was expected)");
  }
  // O_NONBLOCK: a file swapped for a pipe after the check above is opened without waiting, and
  // refused by the fstat below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open " + kind + " (" + open_failure(errno) + ")");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(path + ": cannot read " + kind + " (" + std::strerror(errno) + ")");
  if (S_ISDIR(st.st_mode)) throw Error(path + ": is a folder, not " + kind);
  if (!S_ISREG(st.st_mode)) throw Error(path + ": " + not_a_file(st) + " (" + kind + " was expected)");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes)
    throw Error(path + ": " + mebibytes(size) + " is larger than any " + kind.substr(kind.find(' ') + 1) +
                " vitlens can use (at most " + mebibytes(max_bytes) + "); nothing was read");
  std::string bytes;
  try {
    bytes.resize(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    throw Error(path + ": not enough memory to read " + kind + " of " + mebibytes(size));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, &bytes[done], bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(path + ": read error (" + std::string(std::strerror(errno)) + ")");
    }
    if (n == 0) throw Error(path + ": the file shrank while it was read (" + std::to_string(done) + " of " +
                            std::to_string(bytes.size()) + " bytes)");
    done += static_cast<size_t>(n);
  }
  return bytes;
}


}  // namespace vitlens
