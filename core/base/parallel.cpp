// The worker pool behind run_tasks (parallel.hpp).
//
// One job at a time: the caller holding `busy` writes the job, opens it, bumps `generation`, runs
// tasks itself, closes the job and waits for the workers that entered it (so none still reads the
// job when the next one is written). Workers spin for 0.3 ms after a job (the next operation of a
// training step is usually that close), then sleep on a condition variable.
#include "core/base/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <pthread.h>

namespace vitlens {

namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

constexpr auto kSpinBeforeSleep = std::chrono::microseconds(300);

// True on a pool worker, and on the caller while the pool runs its job: a run_tasks from inside a
// task then starts its own threads instead of asking the pool again (whose lock this thread may
// hold: try_lock on a mutex one owns is undefined).
thread_local bool t_inside_pool_job = false;

// Takes task indices from `next` until none are left; the first exception stops the others at
// their next index and is kept for the caller.
struct Job {
  const std::function<void(int)>* task = nullptr;
  int tasks = 0;
  std::atomic<int> next{0};
  std::mutex failure_lock;
  std::exception_ptr failure;

  void drain() {
    for (int i = next.fetch_add(1, std::memory_order_relaxed); i < tasks;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      try {
        (*task)(i);
      } catch (...) {
        std::lock_guard<std::mutex> hold(failure_lock);
        if (!failure) failure = std::current_exception();
        next.store(tasks, std::memory_order_relaxed);
      }
    }
  }
};

// Threads started for this call alone: for a call made while the pool is busy.
void run_on_new_threads(int tasks, int workers, const std::function<void(int)>& task) {
  Job job;
  job.task = &task;
  job.tasks = tasks;
  std::vector<std::thread> started;
  try {
    for (int t = 1; t < workers; ++t) started.emplace_back([&job] { job.drain(); });
  } catch (...) {
    // No more threads (or no memory for one more): the ones that started and this one share the tasks.
  }
  job.drain();
  for (std::thread& t : started) t.join();
  if (job.failure) std::rethrow_exception(job.failure);
}

class Pool {
 public:
  Pool* orphaned = nullptr;  // the pool set aside before this one in a forked child (below)

  // false when the pool is in use (by another thread, or by the task calling this).
  bool try_run(int tasks, int workers, const std::function<void(int)>& task) {
    if (t_inside_pool_job) return false;
    std::unique_lock<std::mutex> mine(busy_, std::try_to_lock);
    if (!mine.owns_lock()) return false;
    grow(workers - 1);
    // No worker is inside a job here (active_ was 0 when the last one closed), so the fields can
    // be written; a worker reads them only after it has entered the job that published them.
    job_.task = &task;
    job_.tasks = tasks;
    job_.next.store(0, std::memory_order_relaxed);
    job_.failure = nullptr;
    helpers_ = std::min(workers - 1, static_cast<int>(threads_.size()));
    open_.store(true);
    {
      std::lock_guard<std::mutex> hold(sleep_lock_);
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    t_inside_pool_job = true;
    job_.drain();
    t_inside_pool_job = false;
    // Close the job, then wait only for the workers inside it: one the system has not run yet
    // (the machine busy with other work) finds it closed when it wakes and does nothing, instead
    // of being waited for.
    open_.store(false);
    for (int spins = 0; active_.load() > 0; ++spins) {
      if (spins < 4096) cpu_relax();
      else std::this_thread::yield();
    }
    if (job_.failure) std::rethrow_exception(job_.failure);
    return true;
  }

 private:
  void grow(int wanted) {
    while (static_cast<int>(threads_.size()) < wanted) {
      const int index = static_cast<int>(threads_.size());
      const uint64_t now = generation_.load();
      try {
        threads_.emplace_back([this, index, now] { work(index, now); });
      } catch (...) {
        return;  // no more threads (or memory) to be had: the job runs on the ones there are
      }
    }
  }

  void work(int index, uint64_t seen) {
    t_inside_pool_job = true;
    bool helped = false;
    for (;;) {
      seen = wait_for_job(seen, helped);
      // Enter, then check the job is still the one seen and still open (all sequentially
      // consistent: either the caller sees this worker inside and waits, or the worker sees the
      // job closed or replaced and leaves without touching it).
      active_.fetch_add(1);
      helped = open_.load() && generation_.load() == seen && index < helpers_;
      if (helped) job_.drain();
      active_.fetch_sub(1);
    }
  }

  // Spins first only after a job this worker took part in: one beyond the current thread count
  // (the pool keeps the most threads ever asked for) goes straight back to sleep.
  uint64_t wait_for_job(uint64_t seen, bool spin) {
    const auto until = std::chrono::steady_clock::now() + (spin ? kSpinBeforeSleep : std::chrono::microseconds(0));
    for (int spins = 0;; ++spins) {
      const uint64_t g = generation_.load();
      if (g != seen) return g;
      cpu_relax();
      if ((spins & 63) == 63 && std::chrono::steady_clock::now() > until) break;
    }
    std::unique_lock<std::mutex> hold(sleep_lock_);
    wake_.wait(hold, [&] { return generation_.load() != seen; });
    return generation_.load();
  }

  std::mutex busy_;  // held by the caller whose job is running
  std::vector<std::thread> threads_;
  Job job_;
  int helpers_ = 0;  // workers [0, helpers_) take tasks of the current job
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> open_{false};  // the current job takes workers
  std::atomic<int> active_{0};     // workers inside a job (or checking whether to enter)
  std::mutex sleep_lock_;
  std::condition_variable wake_;
};

// This process's pool, made on first use; never destroyed: its workers wait for work until the
// process ends.
//
// A child made by fork() has only the thread that forked. The parent's pool there would count
// workers that do not exist, hand them no task, and every run_tasks would run on the calling
// thread alone: vitlens_bench, which measures the machine's limits (on the pool) before it forks a
// child for each size, timed its "2 threads" on one core that way. So the child sets the parent's
// pool aside and makes its own on first use. The old one is kept, reachable from g_orphaned (a
// list through Pool::orphaned, no allocation in the fork handler), never destroyed: its
// std::thread objects name threads that are not there, and destroying a joinable one ends the
// process. A fork from inside a task (parallel.hpp) is not supported.
std::atomic<Pool*> g_pool{nullptr};
Pool* g_orphaned = nullptr;

void set_pool_aside_in_child() {
  Pool* parents = g_pool.exchange(nullptr);
  if (!parents) return;
  parents->orphaned = g_orphaned;
  g_orphaned = parents;
}

// Registered before main() runs, on one thread; without it a forked child would run its tasks on
// one thread, as before.
[[maybe_unused]] const bool g_fork_handler = pthread_atfork(nullptr, nullptr, set_pool_aside_in_child) == 0;

Pool& pool() {
  Pool* current = g_pool.load();
  if (current) return *current;
  auto* made = new Pool;
  if (g_pool.compare_exchange_strong(current, made)) return *made;
  delete made;  // another thread made the pool first (a new pool has no threads yet)
  return *current;
}

}  // namespace

int resolve_threads(int threads) {
  return threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void run_tasks(int tasks, int threads, const std::function<void(int)>& task) {
  if (tasks <= 0) return;
  const int workers = std::min(resolve_threads(threads), tasks);
  if (workers == 1) {
    for (int i = 0; i < tasks; ++i) task(i);
    return;
  }
  if (!pool().try_run(tasks, workers, task)) run_on_new_threads(tasks, workers, task);
}

}  // namespace vitlens
