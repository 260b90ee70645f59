// The worker pool behind every parallel loop (core/base/parallel.hpp): each task runs
// exactly once for any thread count, the first exception reaches the caller after all tasks are
// done or skipped, calls from inside a task or from two threads at once neither deadlock nor
// lose tasks, and a child made by fork() after the pool started still runs on several threads.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "core/base/parallel.hpp"

using vitlens::run_tasks;

namespace {

// Runs `tasks` tasks on `threads` threads; returns how often each ran.
std::vector<int> counts_of(int tasks, int threads) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
  run_tasks(tasks, threads, [&](int i) { runs[static_cast<size_t>(i)]++; });
  std::vector<int> out;
  for (auto& r : runs) out.push_back(r.load());
  return out;
}

}  // namespace

TEST_CASE("run_tasks runs every task exactly once, for any thread count", "[parallel]") {
  for (int threads : {0, 1, 2, 3, 8})
    for (int tasks : {0, 1, 2, 7, 1000}) {
      INFO("threads " << threads << ", tasks " << tasks);
      const std::vector<int> counts = counts_of(tasks, threads);
      REQUIRE(counts.size() == static_cast<size_t>(tasks));
      for (int c : counts) CHECK(c == 1);
    }
  // Many small jobs back to back (a training step's pattern): none lost, none run twice.
  std::atomic<long> sum{0};
  for (int job = 0; job < 2000; ++job) run_tasks(5, 2, [&](int i) { sum += i + 1; });
  CHECK(sum.load() == 2000L * 15);
}

TEST_CASE("run_tasks rethrows the first exception after the other tasks", "[parallel]") {
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH(run_tasks(64, 2,
                              [&](int i) {
                                ran++;
                                if (i == 3) throw std::runtime_error("task 3 failed");
                              }),
                    "task 3 failed");
  CHECK(ran.load() >= 4);
  CHECK(ran.load() <= 64);
  // The pool is usable again afterwards.
  const std::vector<int> counts = counts_of(100, 2);
  for (int c : counts) CHECK(c == 1);
}

TEST_CASE("run_tasks inside a task and from two threads at once", "[parallel]") {
  // Nested: each outer task runs an inner loop (on its own threads, since the pool is busy).
  std::vector<std::atomic<int>> cells(8 * 16);
  run_tasks(8, 2, [&](int outer) {
    run_tasks(16, 2, [&](int inner) { cells[static_cast<size_t>(outer * 16 + inner)]++; });
  });
  for (auto& c : cells) CHECK(c.load() == 1);

  // Two callers at once: one gets the pool, the other its own threads; both finish everything.
  std::atomic<long> a{0}, b{0};
  std::thread other([&] {
    for (int job = 0; job < 300; ++job) run_tasks(10, 2, [&](int i) { a += i; });
  });
  for (int job = 0; job < 300; ++job) run_tasks(10, 2, [&](int i) { b += i; });
  other.join();
  CHECK(a.load() == 300L * 45);
  CHECK(b.load() == 300L * 45);
}

namespace {

// Runs two tasks on two threads, task 0 waiting (up to 10 s) until task 1 has started: only another
// thread can start it, since this one is inside task 0. True when they ran on two threads at once.
bool two_tasks_at_once() {
  std::atomic<int> started{0};
  std::thread::id ids[2];
  run_tasks(2, 2, [&](int i) {
    ids[i] = std::this_thread::get_id();
    ++started;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  });
  return started.load() == 2 && ids[0] != ids[1];
}

}  // namespace

TEST_CASE("run_tasks in a child made by fork() after the pool started runs on two threads", "[parallel]") {
  // The pool's worker has started and run a task (vitlens_bench measures the machine's limits on
  // the pool before it forks a child per image size); it is waiting for work when the fork comes.
  REQUIRE(two_tasks_at_once());
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    alarm(60);  // a child that hangs ends with SIGALRM: a failure below, not a stuck test
    // With the parent's pool kept, both tasks ran on this thread, one after the other.
    _exit(two_tasks_at_once() ? 0 : 1);  // no Catch2 teardown in the child
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  INFO("the child's exit status " << status << " (0: its two tasks ran on two threads at once)");
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
}
