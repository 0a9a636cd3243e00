#include "core/thread_pool.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace ep {

namespace {
// The pool (and worker index) whose chunk the current thread is running, for nested calls.
thread_local const ThreadPool *tl_pool = nullptr;
thread_local unsigned tl_worker = 0;

struct InsideScope {
  const ThreadPool *saved_pool;
  unsigned saved_worker;
  InsideScope(const ThreadPool *pool, unsigned worker) : saved_pool(tl_pool), saved_worker(tl_worker) {
    tl_pool = pool;
    tl_worker = worker;
  }
  ~InsideScope() {
    tl_pool = saved_pool;
    tl_worker = saved_worker;
  }
  InsideScope(const InsideScope &) = delete;
  InsideScope &operator=(const InsideScope &) = delete;
};
}  // namespace

unsigned ThreadPool::default_threads() {
  if (const char *env = std::getenv("EP_CPU_THREADS"); env && *env) {
    char *end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end && *end == '\0' && v >= 1 && v <= 4096) return static_cast<unsigned>(v);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(unsigned threads) : n_threads_(std::max(1u, threads)) {
  workers_.reserve(n_threads_ - 1);
  try {
    for (unsigned w = 1; w < n_threads_; ++w) workers_.emplace_back([this, w] { worker_main(w); });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto &t : workers_) t.join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto &t : workers_) t.join();
}

void ThreadPool::worker_main(unsigned worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      work_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunks(worker);
  }
}

void ThreadPool::run_chunks(unsigned worker) {
  InsideScope inside(this, worker);
  for (;;) {
    int64_t c = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!running_ || next_ >= n_chunks_ || failed_) {
        if (running_) next_ = n_chunks_;
        return;
      }
      c = next_++;
      ++claimed_;
    }
    try {
      const int64_t begin = c * chunk_;
      (*fn_)(begin, std::min(n_, begin + chunk_), worker);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!failed_) {
        failed_ = true;
        error_ = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++finished_;
      if (finished_ == claimed_) done_cv_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const ChunkFn &fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (tl_pool == this) {  // nested: run inline on this thread
    fn(0, n, tl_worker);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  if (n_threads_ == 1 || n <= grain) {
    InsideScope inside(this, 0);
    fn(0, n, 0);
    return;
  }
  const int64_t max_chunks = static_cast<int64_t>(n_threads_) * 4;
  const int64_t n_chunks = std::min<int64_t>((n + grain - 1) / grain, max_chunks);
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = (n + n_chunks - 1) / n_chunks;
    n_chunks_ = (n + chunk_ - 1) / chunk_;
    next_ = claimed_ = finished_ = 0;
    failed_ = false;
    error_ = nullptr;
    running_ = true;
    ++generation_;
  }
  work_cv_.notify_all();
  run_chunks(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lk(mu_);
    // run_chunks(0) returned, so every chunk has been claimed (or skipped after a failure).
    done_cv_.wait(lk, [&] { return finished_ == claimed_; });
    running_ = false;
    fn_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace ep
