#include "core/thread_pool.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace sparrow {

namespace {

// Below this many multiply-adds a loop runs on the calling thread.
constexpr int64_t kMinParallelWork = int64_t{1} << 15;

thread_local bool t_inside_loop = false;

class Pool {
 public:
  explicit Pool(int threads) : size_(threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return size_; }

  // Returns false if the pool is busy (the caller then runs the loop itself).
  bool run(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      pending_ = size_ - 1;
      ++generation_;
    }
    wake_.notify_all();
    run_range(0, fn);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
    return true;
  }

 private:
  void run_range(int part, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t begin = n_ * part / size_, end = n_ * (part + 1) / size_;
    t_inside_loop = true;
    if (begin < end) fn(begin, end);
    t_inside_loop = false;
  }

  void worker(int part) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t, int64_t)>* fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        fn = fn_;
      }
      run_range(part, *fn);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--pending_ == 0) done_.notify_one();
      }
    }
  }

  const int size_;
  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one loop at a time
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p(thread_pool_size());
  return p;
}

}  // namespace

int thread_pool_size() {
  static const int n = [] {
    if (const char* env = std::getenv("SPARROW_THREADS")) {
      const int v = std::atoi(env);
      if (v >= 1) return std::min(v, 256);
    }
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return n;
}

void parallel_for(int64_t n, int64_t work, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || work < kMinParallelWork || t_inside_loop || thread_pool_size() == 1 || !pool().run(n, fn))
    fn(0, n);
}

}  // namespace sparrow
