#pragma once
// Output files, whole or not at all.
//
// One file (write_file_atomic): bytes go to a temporary in the same folder, are flushed, and the
// temporary is renamed over the target. A failure removes the temporary and leaves any existing
// file untouched.
//
// A set of files (OutputSet, one image's export): every file is written into a private folder
// inside the output folder, then, holding an exclusive flock on the output folder, the private
// folder is renamed to ".vitlens-set-<id>" (the commit point: from then on the set is complete and
// will be moved into place) and each file is renamed into the output folder, the record (the JSON
// sidecar) last; files the previous record listed that the new set does not have are removed before
// the new record appears (when that record is of the same image, and only files no other set's
// record lists and that are not the process's inputs: keep_inputs). SIGINT and SIGTERM wait for a
// commit in progress. A commit cut short by SIGKILL or a power loss leaves its ".vitlens-set-<id>"
// folder, and the next process of the same user writing an OutputSet into that folder (or
// tidy_output_dir) completes it before writing its own, unless another set of that record was
// committed since (the commit folder records which set it replaces): then the interrupted, older
// set is dropped, as completing it would mix the two. A process tidies each folder once, when it
// first writes there. An entry of that name which is another user's, not a folder of ours, or
// cannot be completed is skipped with a one-line warning (set_file_warning_handler): recovery never
// needs another user's permissions, and nothing in a shared folder blocks the next export.
//
// Proof of authorship: vitlens replaces or deletes only files it can prove it wrote. A record is
// a JSON object whose kRecordKey names the record's own file (a user's JSON does not have that
// by accident, and a renamed copy loses it); any other file is ours when such a record in the
// folder lists it. Every other file with an output's name stops the set before anything is moved
// (OutputConflict), unless the set was made to replace foreign files (`--force`); a foreign
// record's "files" are never deleted, whatever the flag. Records of different images can share a
// name ("x_rollout.json": the rollout of x.png, the maps of x_rollout.png): a set replaces a record
// of ours, and the files records list, only when they are of its own image (the file name of the
// record's "image", without extension); another image's record or file stops the set, --force or
// not.
//
// Temporary names are short and fixed-length whatever the target's name:
// ".vitlens-tmp-<pid>-XXXXXX" (a file or a private folder). SIGINT and SIGTERM remove the pending
// ones of this process (see install_cleanup_handlers); ones left by a killed process are removed
// by the next OutputSet or tidy_output_dir in that folder when their process is gone or they are
// older than kStaleTempMinutes. A temporary in use is not removed, whatever its PID or age: its
// process holds an flock on it from its creation (made with the folder locked) until it is moved
// into place or removed, and a tidy leaves a held temporary alone. So an export in another PID
// namespace sharing the folder (whose PID means nothing here), or one running for hours, keeps its
// temporary. Where the file system takes no flock (NFS: none across machines), or the tidying
// user cannot open the temporary, the PID and the age decide alone. The hold is closed on exec; a
// child forked without exec keeps it until it ends.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>

#include "core/base/error.hpp"

namespace vitlens {

constexpr int kStaleTempMinutes = 60;

// The key of a record (OutputSet::commit) whose value is the record's own file name: the proof
// that vitlens wrote the record and the files it lists.
constexpr const char* kRecordKey = "vitlens_record";

// An output's name is taken by a file vitlens cannot prove it wrote, or cannot replace (another
// user's file in a shared folder, a folder): nothing of the set was written. `path` is that file;
// the message names it, and each front end says how to go on (the CLI: --force).
struct OutputConflict : Error {
  OutputConflict(const std::string& path_, const std::string& why, bool forcible_)
      : Error(path_ + ": " + why + "; no file of this export was written"), path(path_), forcible(forcible_) {}
  std::string path;
  bool forcible;  // replacing the set with foreign files allowed would go through
};

// Where one-line warnings go (an interrupted set skipped by a tidy); the default prints
// "vitlens: warning: <text>" on stderr. Not called from a signal handler.
void set_file_warning_handler(std::function<void(const std::string&)> handler);

void write_file_atomic(const std::string& path, const std::string& bytes);
void write_png_atomic(const std::string& path, const cv::Mat& rgb8);  // CV_8UC3 RGB or CV_8UC1

// PNG bytes of an 8-bit RGB or gray picture (OpenCV's encoder, BGR order handled here).
std::vector<unsigned char> png_bytes(const cv::Mat& rgb8, const std::string& what);

// The .npy format (numpy/lib/format.py, version 1.0): magic, header dict, raw little-endian data.
// With data == nullptr, only the header (the caller appends the product(shape) floats).
std::string npy_bytes_f32(const std::vector<size_t>& shape, const float* data);

// A whole file's bytes, read once into the returned string; `kind` names it in errors ("an
// image file"). Throws vitlens::Error for a path that cannot be opened (saying why: no such
// file, a loop of symbolic links, permission denied, ...), a folder, a pipe, device or socket
// (refused from stat, without opening it, so a pipe never blocks), a file larger than max_bytes
// (checked before reading; the message gives the limit) or too little memory.
std::string read_whole_file(const std::string& path, const std::string& kind, uint64_t max_bytes);

// A regular file opened for reading with read_whole_file's checks (the same errors, none of its
// bytes read yet), for formats read in parts: a model's tensors go straight into their own
// buffers instead of through a copy of the whole file.
class InputFile {
 public:
  InputFile(const std::string& path, const std::string& kind, uint64_t max_bytes);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  uint64_t size() const { return size_; }  // as fstat gave it when opened
  // Bytes [offset, offset + count) into dst; throws vitlens::Error on a read error or when the
  // file has shrunk below them since it was opened.
  void read_at(uint64_t offset, void* dst, size_t count) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Whole MiB, or bytes below one ("12 MiB", "512 bytes"), for messages about a file's size.
std::string mebibytes(uint64_t bytes);

// Throws vitlens::Error when `dir` is missing, not a folder or not writable.
void require_writable_dir(const std::string& dir);

// The file at `path` (not followed when a link) as it is now: device, inode, size and
// modification time in one string (an inode freed and given to a new file has another time), or
// nothing when no file has the name. A viewer window remembers the stamps of the files it wrote
// and replaces only those.
std::optional<std::string> file_stamp(const std::string& path);


// Where a streamed file's bytes go (OutputSet::add_stream); write() throws vitlens::Error.
class FileSink {
 public:
  virtual ~FileSink() = default;
  virtual void write(const void* data, size_t size) = 0;
};

class OutputSet {
 public:
  // Creates the private folder in `dir` (after completing interrupted commits and removing stale
  // temporaries there, the first time this process writes into `dir`). With replace_foreign, the
  // set may replace files of its names that vitlens did not write (`--force`). Throws
  // vitlens::Error.
  explicit OutputSet(const std::string& dir, bool replace_foreign = false);
  ~OutputSet();  // not committed: the private folder and everything in it is removed
  OutputSet(const OutputSet&) = delete;
  OutputSet& operator=(const OutputSet&) = delete;

  const std::string& id() const { return id_; }  // unique per set: "<time>-<pid>-<random>"
  std::string final_path(const std::string& name) const { return dir_ + "/" + name; }

  void add(const std::string& name, const std::string& bytes);
  void add_png(const std::string& name, const cv::Mat& rgb8);
  // The file's bytes come from `fill`, written as they come (no copy of the whole file in memory).
  void add_stream(const std::string& name, const std::function<void(FileSink&)>& fill);
  // Moves every file into `dir`, the record `record_name` last, and returns their paths (the
  // record last). The record is `record` (a JSON object) with "files" (the paths of the set's
  // files, in the order added), "set" (id()) and kRecordKey (record_name) set here. Before the
  // commit point, with the folder locked, every name is checked: an existing file vitlens cannot
  // prove it wrote throws OutputConflict (see the proof above). Throws vitlens::Error; after the
  // commit point a failure leaves the set to be completed by the next OutputSet or
  // tidy_output_dir of this user in `dir`.
  std::vector<std::string> commit(const std::string& record_name, nlohmann::json record);
  // Adds the file `name`: a record as commit writes its own, listing the files added since the
  // set had `first` files (size()). A set may hold several records (an export of many layers, one
  // record each); the committed one, written last, lists every file.
  void add_record(const std::string& name, nlohmann::json record, size_t first);
  size_t size() const { return names_.size(); }  // files added so far
  // The files this process reads (a run's images, its painted mask), by device and
  // inode as they are now: no set of this process removes one of them, even where the record it
  // replaces lists it and the new set does not (it stays, unlisted), since the run may not have
  // read it yet. For the process's whole life.
  static void keep_inputs(const std::vector<std::string>& paths);

 private:
  std::string dir_, id_, private_name_;
  std::vector<std::string> names_;  // written so far, in the private folder
  int slot_ = -1;                    // the private folder's entry in the signal cleanup registry
  int hold_ = -1;                    // the flock telling other tidies the private folder is in use
  bool open_ = false;                // the private folder exists and is ours to remove
  bool replace_foreign_ = false;     // --force: names taken by files vitlens did not write are replaced
  void write_member(const std::string& name, const std::function<void(FileSink&)>& fill);
};

// Files replaced together, all of them or none (a training checkpoint: the model and its optimizer
// state). Each file is written into a private folder in `dir` (a temporary, as above); commit()
// then, holding the folder lock, tidies `dir` (completing a group an earlier commit left
// interrupted, removing stale temporaries), renames
// the private folder to ".vitlens-group-[new-]<time>-<pid>-<random>" (the commit point: from then on the
// group is whole and will be moved into place) and renames each file into `dir`. A commit cut
// short after its commit point (SIGKILL, a power loss, a failing rename) is completed by the next
// commit or tidy_output_dir in `dir`; before it, `dir` is untouched. A reader that calls
// tidy_output_dir first therefore finds the newest whole group in place, never a mix of two.
class FileGroup {
 public:
  // Creates the private folder in `dir`. Throws vitlens::Error. With new_names_only, commit()
  // refuses, before its commit point and holding the folder lock, when anything (a file, a link, a
  // folder) has one of the group's names, and its files are moved into place without replacing
  // (RENAME_NOREPLACE), then and when an interrupted commit is completed: the group only ever adds
  // files. A name something else takes between the check and the move keeps what has it: commit()
  // then removes the group's files it moved and throws (nothing written); a completion of an
  // interrupted group drops that one file with a warning.
  explicit FileGroup(const std::string& dir, bool new_names_only = false);
  ~FileGroup();  // not committed: the private folder and everything in it is removed
  FileGroup(const FileGroup&) = delete;
  FileGroup& operator=(const FileGroup&) = delete;

  // `name` is a file name in `dir` (no folder part); its bytes come from `fill`.
  void add_stream(const std::string& name, const std::function<void(FileSink&)>& fill);
  // Throws vitlens::Error; committed() then says whether the commit point was passed (the group is
  // whole in its ".vitlens-group-..." folder and the next commit or tidy completes it) or not
  // (none of the new files reached `dir`, also when a group of new names gave way to a file made
  // meanwhile).
  void commit();
  bool committed() const { return committed_; }

 private:
  std::string dir_, private_name_, id_;
  std::vector<std::string> names_;
  int slot_ = -1, hold_ = -1;  // as OutputSet's
  bool open_ = false, committed_ = false, new_names_only_ = false;
};

// One process at a time in a folder, for as long as the claim lives (a training run and its --out:
// two runs saving into one folder would overwrite each other's checkpoints and mix their logs).
// The claim is an abstract Unix socket bound to a name made of the folder's device and inode, so it
// leaves no file in the user's folder or anywhere else, and it ends with the process however the
// process ends (SIGKILL included). A folder claimed already, by this process or another, throws
// FolderBusy ("<dir>: another vitlens process is training or saving in this folder"). Claims are
// seen by processes of one network namespace on one machine (not across containers with their own
// network, nor across machines sharing a network file system); where the socket cannot be made
// (a sandbox without Unix sockets, no file descriptors left) the claim holds nothing and held()
// says so.
struct FolderBusy : Error {
  explicit FolderBusy(const std::string& message) : Error(message) {}
};

class FolderClaim {
 public:
  // `dir` must exist. Throws vitlens::Error when it cannot be read or is not a folder.
  explicit FolderClaim(const std::string& dir);
  ~FolderClaim();
  FolderClaim(FolderClaim&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  FolderClaim(const FolderClaim&) = delete;
  FolderClaim& operator=(const FolderClaim&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Completes this user's interrupted commits (export sets and file groups) in `dir` (skipping, with
// a warning, what cannot be completed) and removes our stale temporaries there (never a name that
// does not match our patterns). Returns how many entries were completed or removed.
int tidy_output_dir(const std::string& dir);

// SIGINT and SIGTERM remove this process's pending temporaries, then terminate the process as the
// signal would have (the handler is reinstalled as the default and the signal raised again).
// Installed once; a handler the host program installed itself is left in place. OutputSet and
// write_file_atomic call it; programs may call it at start.
void install_cleanup_handlers();

namespace testing {
// Failure injection for tests: the n-th file operation from now (writing one file, or one rename
// of a commit; for a FileGroup also removing its emptied commit folder) fails as a full disk would
// (ENOSPC); 0 turns it off. With `signal`, the process raises that signal there instead (SIGKILL:
// the process is killed at that step, as by kill -9 or a power loss).
void fail_file_operation(long n, int signal = 0);
// The same count, but at the n-th operation `action` runs and the operation then goes on (a test's
// other writer, acting between a check and a commit).
void act_at_file_operation(long n, std::function<void()> action);
}  // namespace testing

}  // namespace vitlens
