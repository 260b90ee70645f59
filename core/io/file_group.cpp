// FileGroup (files.hpp): files replaced together, all of them or none (a training checkpoint: the
// model and its optimizer state). Each is written into a private folder, which is renamed to a
// ".vitlens-group-..." folder (the commit point), then each file is renamed into place; a commit
// cut short after its commit point is completed by the next commit or tidy of the folder.
//
// Index
//   [SECTION] Commit and completion
//   [SECTION] FileGroup
#include <algorithm>
#include <cctype>
#include <cerrno>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/error.hpp"
#include "core/io/files.hpp"
#include "core/io/files_internal.hpp"

namespace vitlens {

namespace files_internal {

namespace {

const char kGroupPrefix[] = ".vitlens-group-";  // + <time>-<pid>-<random>: a committed FileGroup

}  // namespace

// =============================================================================================
// [SECTION] Commit and completion
// =============================================================================================
// A committed group's folder holds its files under their final names; each rename moves one into
// place, so running finish_group again after an interruption moves exactly the rest.
namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

}  // namespace files_internal

using namespace files_internal;

// =============================================================================================
// [SECTION] FileGroup
// =============================================================================================
FileGroup::FileGroup(const std::string& dir, bool new_names_only) : dir_(dir), new_names_only_(new_names_only) {
  install_cleanup_handlers();
  private_name_ = make_private_folder(dir, slot_, hold_, "the new files");
  open_ = true;
  id_ = unique_id(private_name_);
}

FileGroup::~FileGroup() {
  if (!open_) return;
  const std::string path = dir_ + "/" + private_name_;
  for (const std::string& name : names_) ::unlink((path + "/" + name).c_str());
  ::rmdir(path.c_str());
  release_temp(slot_, hold_);
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
    if (new_names_only_) throw Error(dir_ + "/" + name + ": already exists; nothing was written");
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
  release_temp(slot_, hold_);
  open_ = false;
  committed_ = true;
  ::fsync(lock.fd());
  finish_group(lock.fd(), dir_, group_name);
  remove_superseded_groups(lock.fd(), group_name, names_);
}

}  // namespace vitlens
