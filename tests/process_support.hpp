#pragma once
// Shared helpers for tests that run vitlens as a child process or look at what a run left in a
// folder: spawn with the signals the tests send at their default action, reap with the exit code
// or the signal, run vitlens measuring its own peak resident memory (through vitlens_peak_rss),
// optionally under an address-space limit, and list a folder's entries (hidden ones are our
// temporaries and commit folders).
#include <catch2/catch.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_support.hpp"

extern char** environ;

namespace vitlens::test {

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One run of vitlens through the shell (run_vitlens_shell): the exit code (-1 when a signal ended
// it), what it printed on stdout and on stderr.
struct ShellRun {
  int code = -1;
  std::string out, err;
};

// Runs `[env ENV] vitlens ARGS` through the shell (ARGS already shell-quoted where needed), stdin
// from /dev/null, stdout and stderr captured in `dir`/out and `dir`/err (the next run there
// overwrites them). `env` (NAME=VALUE ...) is added to its environment.
inline ShellRun run_vitlens_shell(const std::string& dir, const std::string& args, const std::string& env = "") {
  const std::string cmd = (env.empty() ? std::string() : "env " + env + " ") + std::string(VITLENS_BINARY) + " " + args +
                          " >" + dir + "/out 2>" + dir + "/err </dev/null";
  const int status = std::system(cmd.c_str());
  ShellRun r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(dir + "/out");
  r.err = slurp(dir + "/err");
  return r;
}

// How many lines `text` holds (its '\n's): "one clear line" checks on stderr.
inline int count_lines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

// A run that must fail with one clear line: exit code `code`, exactly one line on stderr, starting
// "vitlens: " and holding `expect` (unless empty).
inline void check_one_line_error(const ShellRun& r, int code, const std::string& expect) {
  CHECK(r.code == code);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.rfind("vitlens: ", 0) == 0);
  if (!expect.empty()) CHECK(r.err.find(expect) != std::string::npos);
}

inline void spit(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

inline std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The PID of a child of ours that has ended and been reaped: a process that is gone, as the PID in
// the name of a temporary left by a killed export.
inline pid_t gone_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

inline int hidden_entries(const std::string& dir) {
  int n = 0;
  for (const std::string& e : entries(dir)) n += e[0] == '.';
  return n;
}

struct Child {
  int code = -1, signal = 0;
  long max_rss_kb = 0;
  std::string err;
  std::string out;  // stdout, when run_vitlens captured it
};

// stdin from /dev/null, stdout into out_path (discarded by default), stderr into err_path.
inline pid_t spawn(const std::vector<std::string>& args, const std::string& err_path,
                   const std::string& out_path = "/dev/null") {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&files, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  // The default action for the signals the tests send, whatever the test runner ignores.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGHUP);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &files, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  REQUIRE(rc == 0);
  return pid;
}

inline Child reap(pid_t pid, const std::string& err_path) {
  int status = 0;
  rusage usage {};
  REQUIRE(::wait4(pid, &status, 0, &usage) == pid);
  Child c;
  if (WIFEXITED(status)) c.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) c.signal = WTERMSIG(status);
  c.max_rss_kb = usage.ru_maxrss;
  c.err = slurp(err_path);
  return c;
}

// Runs `command` (a program's path, then its arguments) through vitlens_peak_rss
// (tests/peak_rss.cpp), so that max_rss_kb is the program's own peak: a child spawned from this
// process would report this process's peak as its floor. stdout is captured into out.
inline Child run_measured(const std::vector<std::string>& command) {
  static const std::string dir = temp_dir("hostile-run");
  const std::string rss_path = dir + "/rss";
  std::remove(rss_path.c_str());
  std::vector<std::string> all = {VITLENS_PEAK_RSS_BINARY, rss_path};
  all.insert(all.end(), command.begin(), command.end());
  Child c = reap(spawn(all, dir + "/err", dir + "/out"), dir + "/err");
  c.out = slurp(dir + "/out");
  const std::string rss = slurp(rss_path);
  INFO("vitlens_peak_rss wrote '" << rss << "'; stderr: " << c.err);
  REQUIRE(!rss.empty());
  c.max_rss_kb = std::stol(rss);
  return c;
}

// Whether a test can put vitlens under an address-space limit: not with a sanitizer's allocator,
// whose shadow memory alone reserves terabytes (test_support.hpp).
#ifdef VITLENS_TEST_SANITIZER_ALLOCATOR
constexpr bool kAddressLimitsWork = false;
#else
constexpr bool kAddressLimitsWork = true;
#endif

// vitlens itself, measured as above. With address_space_mb > 0, vitlens runs under that RLIMIT_AS
// (`ulimit -v`, set by /bin/sh) where kAddressLimitsWork, and without a limit otherwise.
inline Child run_vitlens(const std::vector<std::string>& args, long address_space_mb = 0) {
  if (!kAddressLimitsWork) address_space_mb = 0;
  std::vector<std::string> command;
  if (address_space_mb > 0)
    command = {"/bin/sh", "-c", "ulimit -v " + std::to_string(address_space_mb * 1024) + " && exec \"$0\" \"$@\""};
  command.push_back(VITLENS_BINARY);
  command.insert(command.end(), args.begin(), args.end());
  return run_measured(command);
}

// Raises this process's own peak RSS to at least `mb` MB (touched, then unmapped): a measurement
// of a child that inherited this process's peak would then fail the checks below.
inline void raise_own_peak_rss(size_t mb) {
  const size_t bytes = mb << 20;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  std::memset(p, 1, bytes);
  munmap(p, bytes);
  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  REQUIRE(self.ru_maxrss >= static_cast<long>(mb << 10));
}

}  // namespace vitlens::test
