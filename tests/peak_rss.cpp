// vitlens_peak_rss OUT PROGRAM [ARGS...]: runs PROGRAM with ARGS (stdin, stdout and stderr
// inherited), writes its peak resident set size in kB as one decimal line to OUT, and exits with
// PROGRAM's exit code, or ends by the same signal when a signal ended it (127: it did not run).
//
// Why a process in between: on Linux, exec records the replaced address space's high-water RSS as
// the new program's starting ru_maxrss, and a posix_spawn'd (vfork'ed) child's replaced address
// space is its parent's. A child spawned straight from vitlens_tests therefore reports at least
// vitlens_tests' own peak, whatever it used itself (a 1 GB parent gave /bin/true a peak of 1 GB).
// This program is small, so the peak it reads of its child is the child's own to within its few MB.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

extern char** environ;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: vitlens_peak_rss OUT PROGRAM [ARGS...]\n");
    return 127;
  }
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[2], nullptr, nullptr, argv + 2, environ);
  if (rc != 0) {
    std::fprintf(stderr, "vitlens_peak_rss: cannot run %s: %s\n", argv[2], std::strerror(rc));
    return 127;
  }
  int status = 0;
  rusage usage{};
  pid_t got;
  while ((got = wait4(pid, &status, 0, &usage)) < 0 && errno == EINTR) {
  }
  if (got != pid) {
    std::fprintf(stderr, "vitlens_peak_rss: wait4: %s\n", std::strerror(errno));
    return 127;
  }
  std::FILE* out = std::fopen(argv[1], "w");
  if (!out || std::fprintf(out, "%ld\n", usage.ru_maxrss) < 0 || std::fclose(out) != 0) {
    std::fprintf(stderr, "vitlens_peak_rss: cannot write %s\n", argv[1]);
    return 127;
  }
  if (WIFSIGNALED(status)) {  // the same end as PROGRAM's, so the caller's wait sees the signal
    const rlimit no_core{0, 0};  // PROGRAM's core dump (if any) is the one to keep
    setrlimit(RLIMIT_CORE, &no_core);
    std::signal(WTERMSIG(status), SIG_DFL);
    std::raise(WTERMSIG(status));
    return 128 + WTERMSIG(status);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 127;
}
