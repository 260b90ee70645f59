#pragma once
// One pool of worker threads for every parallel loop in core/ (the training ops, the packed GEMM,
// the inference forward). Starting threads for each operation cost the trainer about a fifth of its
// time on two cores: a training step runs a few hundred operations of 20 to 500 microseconds.
//
// run_tasks(tasks, threads, task) runs task(i) for every i in [0, tasks), on this thread and up to
// threads - 1 pool workers (threads <= 0: one per core). Tasks are handed out in order from a shared
// counter, so which thread runs task i is not fixed: task i's result must not depend on it (every
// caller splits its work into fixed tasks whatever the thread count). The first exception a task
// throws is rethrown here after every task has finished or been skipped.
//
// Calls from inside a task, or while another thread is using the pool, still run in parallel, on
// threads started for that call (the way every loop ran before the pool), never deadlock.
//
// A child made by fork() starts a pool of its own on its first run_tasks. Do not fork from inside
// a task: the child would wait for workers that are not there.
#include <functional>

namespace vitlens {

void run_tasks(int tasks, int threads, const std::function<void(int)>& task);

// The thread count `threads` means: threads <= 0 is one per core (at least 1).
int resolve_threads(int threads);

}  // namespace vitlens
