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

// A committed FileGroup: the prefix, "new-" for a group that only adds files (new_names_only),
// then <time>-<pid>-<random>.
const char kGroupPrefix[] = ".vitlens-group-";
const char kNewNamesMark[] = "new-";

}  // namespace

// =============================================================================================
// [SECTION] Commit and completion
// =============================================================================================
// A committed group's folder holds its files under their final names; each rename moves one into
// place, so running finish_group again after an interruption moves exactly the rest.
namespace {

// A committed group's folder name, read: its id (which sorts by commit time) and whether it only
// adds files. False for anything but exactly the names FileGroup::commit makes: the prefix, the
// optional mark, then unique_id's "<16 hex digits>-<pid>-<6 letters or digits>" (a user's file
// that merely starts alike is not ours).
bool read_group_name(const std::string& name, std::string& id, bool& new_names) {
  const size_t prefix = sizeof kGroupPrefix - 1, mark = sizeof kNewNamesMark - 1;
  if (name.compare(0, prefix, kGroupPrefix) != 0) return false;
  new_names = name.compare(prefix, mark, kNewNamesMark) == 0;
  id = name.substr(prefix + (new_names ? mark : 0));
  const size_t dash = id.find('-', 17);
  if (id.size() < 26 || id[16] != '-' || dash == std::string::npos || dash == 17 || id.size() != dash + 7) return false;
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    const bool ok = i < 16 ? std::isxdigit(c) != 0 : i == 16 || i == dash ? true : i < dash ? std::isdigit(c) != 0 : std::isalnum(c) != 0;
    if (!ok) return false;
  }
  return true;
}

// A committed group of ours in the folder: its folder's name and what read_group_name reads.
struct GroupFolder {
  std::string name, id;
  bool new_names = false;
};

// This user's committed groups in the folder, oldest first. Another user's group in a shared
// folder is theirs to complete (moving its files would need their permissions, and failing here
// would block this user's own saves): named in a warning when `warn_others`, else left silently.
std::vector<GroupFolder> list_groups(int dir_fd, const std::string& dir, bool warn_others) {
  std::vector<GroupFolder> groups;
  for (const std::string& name : list_names(dir_fd)) {
    GroupFolder g;
    g.name = name;
    struct stat st {};
    if (!read_group_name(name, g.id, g.new_names) || ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISDIR(st.st_mode))
      continue;
    if (st.st_uid != ::geteuid()) {
      if (warn_others)
        warn(dir + "/" + name + ": another user's (uid " + std::to_string(st.st_uid) + "); only that user can complete it; skipped");
      continue;
    }
    groups.push_back(g);
  }
  std::sort(groups.begin(), groups.end(), [](const GroupFolder& a, const GroupFolder& b) { return a.id < b.id; });
  return groups;
}

// Moves the files of the committed group into the folder, then removes the group's folder. A
// group that only adds files never replaces anything: a name taken since its commit point (by
// anyone) keeps what has it, and the group's file of that name is dropped, named in a warning;
// returns those names. Called with the folder locked.
std::vector<std::string> finish_group(int dir_fd, const std::string& dir, const GroupFolder& group) {
  const int group_fd = ::openat(dir_fd, group.name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (group_fd < 0) throw Error(dir + "/" + group.name + ": cannot open (" + errno_text(errno) + ")");
  std::vector<std::string> names = list_names(group_fd), dropped;
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const int moved = group.new_names ? rename_new_at(group_fd, name.c_str(), dir_fd, name.c_str())
                                      : rename_at(group_fd, name.c_str(), dir_fd, name.c_str());
    if (moved == 0) continue;
    const int err = errno;
    if (group.new_names && err == EEXIST) {
      // Our own file already (a link made by rename_new_at's fallback before an interruption):
      // the group's entry is the same file, removed without a word.
      struct stat in_group {}, in_place {};
      const bool same = ::fstatat(group_fd, name.c_str(), &in_group, AT_SYMLINK_NOFOLLOW) == 0 &&
                        ::fstatat(dir_fd, name.c_str(), &in_place, AT_SYMLINK_NOFOLLOW) == 0 &&
                        in_group.st_dev == in_place.st_dev && in_group.st_ino == in_place.st_ino;
      if (::unlinkat(group_fd, name.c_str(), 0) == 0) {
        if (same) continue;
        warn(dir + "/" + name + ": was made by something else after vitlens committed a file of this name; that "
                                "file is kept and vitlens' copy dropped");
        dropped.push_back(name);
        continue;
      }
    }
    ::close(group_fd);
    throw Error(dir + "/" + name + ": moving it into place from " + group.name + " failed (" + errno_text(err) + ")");
  }
  ::close(group_fd);
  // An emptied group folder left behind (a failure or a kill here) is removed by the next call.
  if (!injected_failure()) ::unlinkat(dir_fd, group.name.c_str(), AT_REMOVEDIR);
  ::fsync(dir_fd);
  return dropped;
}

}  // namespace

// Every committed group in the folder, oldest first (their ids begin with the commit time, in
// fixed-width hex), so that the newest files end up in place. Called with the folder locked.
int finish_groups(int dir_fd, const std::string& dir) {
  int done = 0;
  for (const GroupFolder& group : list_groups(dir_fd, dir, true)) {
    // One that cannot be completed (a file in its way it may not replace) never blocks later
    // saves or reads: the files in place stay, and a newer group of the same files supersedes it.
    try {
      finish_group(dir_fd, dir, group);
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
void remove_superseded_groups(int dir_fd, const std::string& dir, const GroupFolder& newest,
                              const std::vector<std::string>& names) {
  for (const GroupFolder& group : list_groups(dir_fd, dir, false)) {
    if (group.id >= newest.id) continue;
    const int group_fd = ::openat(dir_fd, group.name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (group_fd < 0) continue;
    const std::vector<std::string> left = list_names(group_fd);
    ::close(group_fd);
    const bool covered = std::all_of(left.begin(), left.end(), [&](const std::string& n) {
      return std::find(names.begin(), names.end(), n) != names.end();
    });
    if (covered) remove_tree_at(dir_fd, group.name);
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
  GroupFolder group;
  group.id = id_;
  group.new_names = new_names_only_;
  group.name = kGroupPrefix + std::string(new_names_only_ ? kNewNamesMark : "") + id_;
  if (rename_at(lock.fd(), private_name_.c_str(), lock.fd(), group.name.c_str()) != 0)
    throw Error(dir_ + ": committing the new files failed (" + errno_text(errno) + ")");
  // The commit point: the group is whole and on its way into place; neither the signal handler
  // nor the destructor may remove it now.
  release_temp(slot_, hold_);
  open_ = false;
  committed_ = true;
  ::fsync(lock.fd());
  const std::vector<std::string> dropped = finish_group(lock.fd(), dir_, group);
  remove_superseded_groups(lock.fd(), dir_, group, names_);
  // Between the check above and the move, something other than vitlens made one of the names:
  // the group's other files, just moved into place by this call, go too (all or none), and
  // what the other writer made stays.
  if (!dropped.empty()) {
    for (const std::string& name : names_)
      if (std::find(dropped.begin(), dropped.end(), name) == dropped.end()) ::unlinkat(lock.fd(), name.c_str(), 0);
    ::fsync(lock.fd());
    committed_ = false;  // nothing of the group is left to put in place
    throw Error(dir_ + "/" + dropped.front() + ": was made by something else while vitlens wrote it; that file is kept, "
                "and nothing was written");
  }
}

}  // namespace vitlens
