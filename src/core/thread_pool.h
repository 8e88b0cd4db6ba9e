// A small fixed thread pool for data-parallel loops (the CPU backend's only source of threads).
//
// parallel_for splits [0, n) into one contiguous range per thread, so each index is always handled
// by exactly one call of `fn` and results never depend on scheduling. Workers block on a condition
// variable between loops (no spinning: a decode step of a small model is hundreds of short loops).
// Thread-safety: parallel_for may be called from any thread; a call made from inside a running
// loop, or while another loop is running, runs serially on the calling thread.
#pragma once

#include <cstdint>
#include <functional>

namespace sparrow {

// Threads the pool uses: SPARROW_THREADS if set, else the hardware concurrency.
int thread_pool_size();

// Calls fn(begin, end) on disjoint ranges covering [0, n). Runs serially when `work` (an estimate
// of multiply-adds) is too small to be worth waking the pool.
void parallel_for(int64_t n, int64_t work, const std::function<void(int64_t begin, int64_t end)>& fn);

}  // namespace sparrow
