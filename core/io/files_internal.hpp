#pragma once
// What the output-file sources share inside core/io (not for other rooms): the reserved names, the
// signal cleanup registry, failure injection, warnings, writing one file through a descriptor,
// the folder lock and the folder tidy. The protocol itself is described in files.hpp.
//
//   files.cpp         one file written whole (write_file_atomic, PNG and .npy bytes)
//   file_cleanup.cpp  the signal cleanup registry, failure injection, warnings
//   folder_tidy.cpp   the folder lock, listing, temporaries, tidying a (possibly shared) folder
//   output_set.cpp    export sets and the records that prove which files vitlens wrote
//   file_group.cpp    FileGroup: files replaced together (a checkpoint's model and state)
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "core/io/files.hpp"

namespace vitlens::files_internal {

inline constexpr char kTempPrefix[] = ".vitlens-tmp-";  // + <pid>-XXXXXX
inline constexpr char kSetPrefix[] = ".vitlens-set-";   // + <set id>
inline constexpr size_t kMaxRecordBytes = 16 << 20;     // ours are kilobytes: a larger file is not read as a record

std::string errno_text(int err);

// ---- The signal cleanup registry (file_cleanup.cpp) ----
// Registers a temporary file or private folder for removal on SIGINT / SIGTERM / SIGHUP; returns
// its slot, or -1 when the table is full (a leftover is then removed by the next run's tidy).
int register_temp(const std::string& path);
void unregister_temp(int slot);

// Blocks the cleanup signals on this thread for its lifetime: between creating a temporary and
// registering it, and during a commit.
class BlockCleanupSignals {
 public:
  BlockCleanupSignals();
  ~BlockCleanupSignals();
  BlockCleanupSignals(const BlockCleanupSignals&) = delete;
  BlockCleanupSignals& operator=(const BlockCleanupSignals&) = delete;

 private:
  sigset_t saved_{};
};

// ... and marks a critical section in progress, which a handler on another thread waits for.
class CriticalSection {
 public:
  CriticalSection();
  ~CriticalSection();
  CriticalSection(const CriticalSection&) = delete;
  CriticalSection& operator=(const CriticalSection&) = delete;

 private:
  BlockCleanupSignals blocked_;  // constructed first: the count never rises with signals open
};

// ---- Failure injection (file_cleanup.cpp) ----
// True for the operation the test asked to fail (counting down from fail_file_operation's n); with
// a signal asked for, the process raises it there instead.
bool injected_failure();
// renameat, or the injected failure (ENOSPC).
int rename_at(int from_dir, const char* from, int to_dir, const char* to);
// As rename_at, but never replaces: fails with EEXIST when anything has the name `to`
// (renameat2's RENAME_NOREPLACE; where the file system lacks it, a hard link, then the unlink).
int rename_new_at(int from_dir, const char* from, int to_dir, const char* to);

// ---- Warnings (file_cleanup.cpp) ----
void warn(const std::string& text);

// ---- Writing one file through a descriptor (files.cpp) ----
// Creates `path` (a new file in a private folder) and fills it; a failed write removes it. `what`
// names the final path in errors.
void write_new_file(const std::string& path, const std::string& what, const std::function<void(FileSink&)>& fill);

// ---- The folder: lock, listing, temporaries, tidy (folder_tidy.cpp) ----
// An exclusive flock on the output folder itself (no lock file in the user's folder): commits,
// tidies and the creation of temporaries in one folder take turns, across processes. Local file
// systems only (flock).
inline constexpr std::chrono::milliseconds kBriefLockWait{500};
class FolderLock {
 public:
  explicit FolderLock(const std::string& dir);  // waits for the lock; throws where it cannot take it
  // Waits at most kBriefLockWait; where the folder cannot be opened or locked by then, holds
  // nothing instead of throwing or waiting on.
  FolderLock(const std::string& dir, std::nothrow_t);
  ~FolderLock();  // closing releases the lock
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// Holding a temporary in use (files.hpp): an exclusive flock on the file or private folder at
// `path`, taken by its process right after creating it, with the folder locked, so that no tidy
// sees it unheld. Returns the descriptor that holds it, or -1 where the file system takes no flock.
int hold_temp(const std::string& path);
// Its end, once the temporary is moved into place or removed: out of the signal cleanup registry
// (slot) and no longer held (hold); both become -1.
void release_temp(int& slot, int& hold);

std::vector<std::string> list_names(int dir_fd);
// Reads the regular file `name` (never a link, a FIFO or a device: a user's file of a record's
// name must not block or flood the reader) of at most max_bytes. False, with errno, otherwise.
bool read_at(int dir_fd, const std::string& name, std::string& out, size_t max_bytes = kMaxRecordBytes);
// Removes the file or the folder of plain files `name`.
void remove_tree_at(int dir_fd, const std::string& name);
// A private folder in `dir` (a temporary, registered for the signal cleanup in `slot`, held by
// `hold`: hold_temp); returns its name.
std::string make_private_folder(const std::string& dir, int& slot, int& hold, const std::string& what);
// The template mkstemp fills in for a temporary in `dir`.
std::string temp_template(const std::string& dir);
// Unique per process and call: "<nanoseconds since the epoch, 16 hex digits>-<pid>-<the private
// folder's random part>"; the fixed-width time first sorts names by age.
std::string unique_id(const std::string& private_name);
// With the folder locked: completes this user's interrupted commits, removes stale temporaries.
int tidy_locked(int dir_fd, const std::string& dir);

// ---- Export sets (output_set.cpp) ----
// Moves a complete set from the commit folder `commit_name` into the folder, the record last
// (see output_set.cpp). Called with the folder locked. Throws vitlens::Error.
void finish_commit(int dir_fd, const std::string& dir, const std::string& commit_name, bool recovering);

// ---- File groups (file_group.cpp) ----
// Completes every committed group in the folder, oldest first; returns how many. Called with the
// folder locked.
int finish_groups(int dir_fd, const std::string& dir);

}  // namespace vitlens::files_internal
