// The safety net under the output files (files.hpp): the signal cleanup registry (SIGINT, SIGTERM
// and SIGHUP remove this process's pending temporaries, async-signal-safe), failure injection for
// tests (the n-th file operation fails as a full disk would), and where one-line warnings go.
//
// Index
//   [SECTION] Signal cleanup registry (async-signal-safe)
//   [SECTION] Failure injection
//   [SECTION] Warnings
//   [SECTION] Public functions
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/io/files.hpp"
#include "core/io/files_internal.hpp"

namespace vitlens {

namespace files_internal {

std::string errno_text(int err) { return std::strerror(err); }

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

BlockCleanupSignals::BlockCleanupSignals() {
  sigset_t block;
  sigemptyset(&block);
  for (int sig : kCleanupSignals) sigaddset(&block, sig);
  ::pthread_sigmask(SIG_BLOCK, &block, &saved_);
}

BlockCleanupSignals::~BlockCleanupSignals() { ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }

CriticalSection::CriticalSection() { g_critical.fetch_add(1); }

CriticalSection::~CriticalSection() { g_critical.fetch_sub(1); }

// =============================================================================================
// [SECTION] Failure injection
// =============================================================================================
namespace {

std::atomic<long> g_fail_countdown{0};
std::atomic<int> g_fail_signal{0};
std::function<void()> g_fail_action;  // set before the countdown starts, read at its end

}  // namespace

// True for the operation the test asked to fail (counting down from fail_file_operation's n); with
// a signal asked for, the process raises it there instead; with an action, the action runs there
// and the operation goes on.
bool injected_failure() {
  long v = g_fail_countdown.load();
  while (v > 0)
    if (g_fail_countdown.compare_exchange_weak(v, v - 1)) {
      if (v != 1) return false;
      if (g_fail_signal.load() != 0) ::raise(g_fail_signal.load());
      if (!g_fail_action) return true;
      g_fail_action();
      return false;
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

int rename_new_at(int from_dir, const char* from, int to_dir, const char* to) {
  if (injected_failure()) {
    errno = ENOSPC;
    return -1;
  }
  if (::renameat2(from_dir, from, to_dir, to, RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
  if (::linkat(from_dir, from, to_dir, to, 0) == 0) return ::unlinkat(from_dir, from, 0);
  if (errno != EPERM && errno != EOPNOTSUPP && errno != ENOSYS) return -1;
  // Neither a no-replace rename nor hard links (some FUSE file systems): a check, then the rename,
  // with the folder locked by the caller (only a writer that ignores the lock can come between).
  struct stat st {};
  if (::fstatat(to_dir, to, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    errno = EEXIST;
    return -1;
  }
  return ::renameat(from_dir, from, to_dir, to);
}

// =============================================================================================
// [SECTION] Warnings
// =============================================================================================
namespace {

std::mutex g_warning_lock;
std::function<void(const std::string&)> g_warning_handler;  // empty: stderr

}  // namespace

void warn(const std::string& text) {
  const std::lock_guard<std::mutex> hold(g_warning_lock);
  if (g_warning_handler) g_warning_handler(text);
  else std::fprintf(stderr, "vitlens: warning: %s\n", text.c_str());
}

}  // namespace files_internal

using namespace files_internal;

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
  g_fail_countdown.store(0);
  g_fail_action = nullptr;
  g_fail_signal.store(signal);
  g_fail_countdown.store(n);
}

void testing::act_at_file_operation(long n, std::function<void()> action) {
  g_fail_countdown.store(0);
  g_fail_signal.store(0);
  g_fail_action = std::move(action);
  g_fail_countdown.store(n);
}

void set_file_warning_handler(std::function<void(const std::string&)> handler) {
  const std::lock_guard<std::mutex> hold(g_warning_lock);
  g_warning_handler = std::move(handler);
}

}  // namespace vitlens
