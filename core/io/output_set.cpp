// Export sets (OutputSet, files.hpp): the files of one image's export moved into place together,
// the record (the JSON sidecar) last, and the records that prove which files vitlens wrote: a name
// taken by a file no record of ours lists, or one another image's record lists, stops the set
// before anything moves (OutputConflict); files the previous record of the same image listed that
// the new set does not have are removed. A commit cut short is completed (or dropped, when a
// newer set replaced it) by the next tidy of the folder.
//
// Index
//   [SECTION] Records: the proof of authorship
//   [SECTION] Commit and completion
//   [SECTION] OutputSet
#include <algorithm>
#include <cerrno>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/base/utf8.hpp"
#include "core/io/files.hpp"
#include "core/io/files_internal.hpp"
#include "core/io/json_text.hpp"
#include "core/io/paths.hpp"

namespace vitlens {

namespace files_internal {

namespace {

const char kRecordFile[] = ".record";        // inside a commit folder: the record, moved last
const char kNameFile[] = ".name";            // inside a commit folder: the record's final name
const char kReplacesFile[] = ".replaces";    // inside a commit folder: the set id of the record it replaces
const char kForceFile[] = ".force";          // inside a commit folder: the set may replace foreign files

// =============================================================================================
// [SECTION] Records: the proof of authorship
// =============================================================================================
// A Linux file name is any bytes, JSON text is UTF-8: a record writes the names it proves
// (kRecordKey, "files") as recorded_name, which keeps UTF-8 text as it is and writes every other
// byte, and every backslash, as "\xNN". Escaping the backslash too makes it one-to-one: a name read
// back is the exact name on disk, and a user's file literally named "caf\xe9.png" is never taken
// for the Latin-1 name a record writes so. Records written before this escaping hold names
// as plain text (and a non-UTF-8 name as U+FFFD, which proves nothing); record_form tells the two
// apart by the record's own name.

// `name` as a record writes it (see above).
std::string recorded_name(const std::string& name) { return utf8_escaped(name, true); }

// The name `text` stands for when it is a recorded_name, or nothing when recorded_name writes no
// name so ("\x41" for "A", a backslash that starts no escape).
std::optional<std::string> name_of_recorded(const std::string& text) {
  const auto hex_value = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  std::string name;
  name.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\') {
      name += text[i];
      continue;
    }
    if (i + 3 >= text.size()) return std::nullopt;
    const int hi = hex_value(text[i + 2]), lo = hex_value(text[i + 3]);
    if (text[i + 1] != 'x' || hi < 0 || lo < 0) return std::nullopt;
    name += static_cast<char>(hi * 16 + lo);
    i += 3;
  }
  if (recorded_name(name) != text) return std::nullopt;
  return name;
}

// How a record names files: escaped (recorded_name), or as plain text (a record from before the
// escaping), which can differ only for a name with a backslash.
enum class RecordForm { Escaped, Plain };

// The file `name` of the folder as JSON; discarded (not an object) when missing, unreadable or not JSON.
nlohmann::json read_json_at(int dir_fd, const std::string& name) {
  std::string bytes;
  if (!read_at(dir_fd, name, bytes)) return nlohmann::json();
  return parse_json_or_discarded(bytes);
}

// Whether `j`, the folder's file `name`, is a record vitlens wrote (a JSON object whose kRecordKey
// is its own file name), and how it names files; nothing when it is not one. A name without a
// backslash that is UTF-8 reads the same in both forms.
std::optional<RecordForm> record_form(const nlohmann::json& j, const std::string& name) {
  if (!j.is_object() || !j.contains(kRecordKey) || !j[kRecordKey].is_string()) return std::nullopt;
  const std::string& key = j[kRecordKey].get_ref<const std::string&>();
  if (key == recorded_name(name)) return RecordForm::Escaped;
  if (key == name) return RecordForm::Plain;
  return std::nullopt;
}

// A record's "set" id ("" when it has none or is not JSON).
std::string set_id_in(const nlohmann::json& j) {
  if (j.is_object() && j.contains("set") && j["set"].is_string()) return j["set"].get<std::string>();
  return "";
}

std::string set_id_of(const std::string& record) { return set_id_in(parse_json_or_discarded(record)); }

// Whose a record is: the image its set was made from, as outputs are named after it (the file
// name of its "image" without folder and extension, as output_stem takes it), or nothing for a
// record without one. Records share a name across images ("x_layer0.json" is a layer record of
// x.png and the record of x_layer0.png; "x_rollout.json" the rollout of x.png and the maps of
// x_rollout.png), so a record of the name a set writes is its previous one only when it is of
// the same image. Names that differ only in bytes that are not UTF-8 (written as U+FFFD) are taken
// as one image's.
std::optional<std::string> image_of(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("image") || !j["image"].is_string()) return std::nullopt;
  std::string name = base_name(j["image"].get<std::string>());
  const auto dot = name.find_last_of('.');
  if (dot != std::string::npos && dot > 0) name.erase(dot);
  return name.empty() ? "image" : name;
}

// A record without an image (a set that is not an image's export) is taken as any image's.
bool same_image(const std::optional<std::string>& a, const std::optional<std::string>& b) { return !a || !b || *a == *b; }

// The set id of the record `name` in the folder: "" when there is none, "?" when unreadable.
std::string current_set_id(int dir_fd, const std::string& name) {
  std::string record;
  if (!read_at(dir_fd, name, record)) return errno == ENOENT ? "" : "?";
  return set_id_of(record);
}

// The file names the "files" array of a record of ours lists, read in the record's form (empty
// when it has none; an entry no recorded_name writes proves nothing).
std::set<std::string> listed_names(const nlohmann::json& j, RecordForm form) {
  std::set<std::string> names;
  if (j.is_object() && j.contains("files") && j["files"].is_array())
    for (const auto& f : j["files"]) {
      if (!f.is_string()) continue;
      const std::string listed = base_name(f.get<std::string>());
      if (form == RecordForm::Plain) {
        names.insert(listed);
      } else if (const std::optional<std::string> name = name_of_recorded(listed)) {
        names.insert(*name);
      }
    }
  return names;
}

// A record of ours that proves a file: the record's name, its set id and its image.
struct Owner {
  std::string record, set;
  std::optional<std::string> image;
};

// The folder's records of ours and what they prove: for each file a record lists, and each record
// itself, the records that own it. Reads each JSON file of the folder, so it is called only when
// the record a set replaces does not settle a name, or when files it listed are to be removed.
std::map<std::string, std::vector<Owner>> owners_in_folder(int dir_fd) {
  std::map<std::string, std::vector<Owner>> owners;
  for (const std::string& name : list_names(dir_fd)) {
    if (name.size() < 6 || name.compare(name.size() - 5, 5, ".json") != 0) continue;
    const nlohmann::json j = read_json_at(dir_fd, name);
    const std::optional<RecordForm> form = record_form(j, name);
    if (!form) continue;
    const Owner owner{name, set_id_in(j), image_of(j)};
    owners[name].push_back(owner);
    for (const std::string& listed : listed_names(j, *form)) owners[listed].push_back(owner);
  }
  return owners;
}

// Throws OutputConflict when one of `members` or the record `record_name` of a set made from
// `image` (image_of) cannot be put in place: its name is taken by a folder, by another user's file
// in a shared (sticky) folder (which only its owner may replace), by a file a record of another
// image lists or by such a record (vitlens' own, but another export's: replacing it would leave
// that record listing files it did not write, whatever --force says), or, unless replace_foreign,
// by a file vitlens cannot prove it wrote. Called with the folder locked, before anything is moved.
void check_names(int dir_fd, const std::string& dir, const std::string& record_name,
                 const std::vector<std::string>& members, const std::optional<std::string>& image,
                 bool replace_foreign) {
  struct stat dir_st {};
  if (::fstat(dir_fd, &dir_st) != 0) throw Error(dir + ": cannot read the output folder (" + errno_text(errno) + ")");
  const uid_t me = ::geteuid();
  const bool shared = (dir_st.st_mode & S_ISVTX) != 0 && dir_st.st_uid != me && me != 0;
  const nlohmann::json old_record = read_json_at(dir_fd, record_name);
  const std::optional<RecordForm> old_form = record_form(old_record, record_name);
  const bool old_is_ours = old_form && same_image(image_of(old_record), image);
  const std::set<std::string> listed = old_is_ours ? listed_names(old_record, *old_form) : std::set<std::string>{};
  std::optional<std::map<std::string, std::vector<Owner>>> owners;  // read once, when first needed
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
    if (name == record_name ? old_is_ours : listed.count(name) > 0) continue;
    if (!owners) owners = owners_in_folder(dir_fd);
    if (const auto it = owners->find(name); it != owners->end()) {
      for (const Owner& owner : it->second)
        if (!same_image(owner.image, image))
          throw OutputConflict(path,
                               (owner.record == name ? std::string("is the record of another image's export")
                                                     : "belongs to another image's export (" + owner.record + " lists it)") +
                                   ", which this export does not replace; export into another folder",
                               false);
      continue;
    }
    if (replace_foreign) continue;
    throw OutputConflict(path, "exists and no record of vitlens here lists it (vitlens did not write it, or a "
                               "version before records did)", true);
  }
}

// (device, inode) of the inputs the process said it reads (OutputSet::keep_inputs).
std::mutex g_inputs_lock;
std::set<std::pair<dev_t, ino_t>> g_inputs;

// Whether the folder's file `name` (links followed) is one of those inputs.
bool is_input(int dir_fd, const std::string& name) {
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, 0) != 0) return false;
  const std::lock_guard<std::mutex> hold(g_inputs_lock);
  return g_inputs.count({st.st_dev, st.st_ino}) > 0;
}

// Removes the files the record `record_name` in place lists and `fresh`, the record about to
// replace it, does not (fewer heads, no --raw, a narrower --layer range), before `fresh` appears.
// Only when the record in place is ours and of the same image (another image's record of this
// name was refused by check_names, or is from a version before that check: its files are not this
// set's to remove), and only files no record outside that set lists (another set's too) and no
// input of this process (it reads them later: they stay, unlisted).
void remove_unlisted(int dir_fd, const std::string& record_name, const nlohmann::json& fresh) {
  const nlohmann::json old_record = read_json_at(dir_fd, record_name);
  const std::optional<RecordForm> old_form = record_form(old_record, record_name);
  if (!old_form || !same_image(image_of(old_record), image_of(fresh))) return;
  const std::set<std::string> keep = listed_names(fresh, RecordForm::Escaped);
  // Only the set's own names, whatever its record lists (a record edited by hand, or copied in
  // from elsewhere, names no other file to remove): "<stem>_..." of the record "<stem>.json", or
  // of "<stem>_layers.json" / "<stem>_rollout.json".
  const std::string base = record_name.substr(0, record_name.size() - std::min<size_t>(5, record_name.size()));
  std::vector<std::string> prefixes{base + "_"};
  for (const std::string tail : {"_layers", "_rollout"})
    if (base.size() > tail.size() && base.compare(base.size() - tail.size(), tail.size(), tail) == 0)
      prefixes.push_back(base.substr(0, base.size() - tail.size()) + "_");
  const auto set_name = [&](const std::string& name) {
    return std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return name.rfind(p, 0) == 0; });
  };
  std::vector<std::string> unlisted;
  for (const std::string& old : listed_names(old_record, *old_form))
    if (!keep.count(old) && old != record_name && set_name(old)) unlisted.push_back(old);
  if (unlisted.empty()) return;
  // The set being replaced: its record and the records it holds (one per layer), which share its id.
  const std::string old_set = set_id_in(old_record);
  const auto in_old_set = [&](const Owner& owner) {
    return owner.record == record_name || (!old_set.empty() && owner.set == old_set);
  };
  const std::map<std::string, std::vector<Owner>> owners = owners_in_folder(dir_fd);
  for (const std::string& name : unlisted) {
    const auto it = owners.find(name);
    if (it != owners.end() && !std::all_of(it->second.begin(), it->second.end(), in_old_set)) continue;
    if (is_input(dir_fd, name)) continue;
    ::unlinkat(dir_fd, name.c_str(), 0);
  }
}

bool is_internal_name(const std::string& name) {
  return name == kRecordFile || name == kNameFile || name == kReplacesFile || name == kForceFile;
}

}  // namespace

// =============================================================================================
// [SECTION] Commit and completion
// =============================================================================================
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
  std::string record;
  const bool has_record = read_at(set_fd, kRecordFile, record);
  const nlohmann::json fresh = has_record ? parse_json_or_discarded(record) : nlohmann::json();
  if (recovering) {
    struct stat st {};
    const bool replace_foreign = ::fstatat(set_fd, kForceFile, &st, AT_SYMLINK_NOFOLLOW) == 0;
    try {
      check_names(dir_fd, dir, record_name, members, image_of(fresh), replace_foreign);
    } catch (...) {
      ::close(set_fd);
      throw;
    }
  }
  for (const std::string& name : members)
    if (rename_at(set_fd, name.c_str(), dir_fd, name.c_str()) != 0) fail(name, errno);
  if (has_record) {
    // Files of the previous set that this one does not have would be left beside the new record.
    remove_unlisted(dir_fd, record_name, fresh);
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

}  // namespace files_internal

using namespace files_internal;

// =============================================================================================
// [SECTION] OutputSet
// =============================================================================================
namespace {

// Each folder is tidied once per process (listing a folder of 100000 files for every image of a
// batch would cost more than the export).
bool first_set_in(const std::string& dir) {
  static std::mutex lock;
  static std::set<std::pair<dev_t, ino_t>> seen;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return true;
  const std::lock_guard<std::mutex> hold(lock);
  return seen.insert({st.st_dev, st.st_ino}).second;
}

// A record's bytes: `record` with the paths of `files` ("files"), the set id ("set") and the
// proof that vitlens wrote it (kRecordKey: its own name), these names as recorded_name, so that
// they read back exactly.
std::string record_bytes(nlohmann::json record, const std::string& name, const std::string& set_id,
                         const std::vector<std::string>& files) {
  nlohmann::json listed = nlohmann::json::array();
  for (const std::string& path : files) listed.push_back(recorded_name(path));
  record["files"] = std::move(listed);
  record["set"] = set_id;
  record[kRecordKey] = recorded_name(name);
  // replace: other text that is not valid UTF-8 (the image's path, shown only) must not make the
  // JSON writer throw.
  return record.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace

OutputSet::OutputSet(const std::string& dir, bool replace_foreign) : dir_(dir), replace_foreign_(replace_foreign) {
  install_cleanup_handlers();
  if (first_set_in(dir)) tidy_output_dir(dir);
  private_name_ = make_private_folder(dir, slot_, hold_, "the export");
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
  release_temp(slot_, hold_);
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

void OutputSet::add_record(const std::string& name, nlohmann::json record, size_t first) {
  std::vector<std::string> files;
  for (size_t i = first; i < names_.size(); ++i) files.push_back(final_path(names_[i]));
  add(name, record_bytes(std::move(record), name, id_, files));
}

void OutputSet::keep_inputs(const std::vector<std::string>& paths) {
  const std::lock_guard<std::mutex> hold(g_inputs_lock);
  for (const std::string& path : paths) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) g_inputs.insert({st.st_dev, st.st_ino});
  }
}

std::vector<std::string> OutputSet::commit(const std::string& record_name, nlohmann::json record) {
  const std::vector<std::string> members = names_;  // the set's files, before the internal ones
  if (record_name.empty() || record_name.find('/') != std::string::npos || is_internal_name(record_name) ||
      std::find(members.begin(), members.end(), record_name) != members.end())
    throw Error(final_path(record_name) + ": internal: not a record name for this set");
  std::vector<std::string> written;
  for (const std::string& name : members) written.push_back(final_path(name));
  const std::string bytes = record_bytes(std::move(record), record_name, id_, written);
  // As the record reads back (an image's name that is not UTF-8 is written with U+FFFD), to be
  // compared with the records in the folder.
  const std::optional<std::string> image = image_of(parse_json_or_discarded(bytes));
  write_member(kRecordFile, [&](FileSink& sink) { sink.write(bytes.data(), bytes.size()); });
  write_member(kNameFile, [&](FileSink& sink) { sink.write(record_name.data(), record_name.size()); });
  if (replace_foreign_) write_member(kForceFile, [](FileSink&) {});
  FolderLock lock(dir_);
  const CriticalSection no_signals;
  check_names(lock.fd(), dir_, record_name, members, image, replace_foreign_);
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
  release_temp(slot_, hold_);
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

}  // namespace vitlens
