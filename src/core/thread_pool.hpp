// A small fork-join thread pool for the CPU backend: parallel_for() splits an index range into
// chunks that the calling thread and the pool's workers take one at a time, and returns when
// every chunk is done. Work is only ever split by output (each index writes its own results),
// so results do not depend on the thread count or on which thread ran which chunk.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ep {

class ThreadPool {
 public:
  /// fn(begin, end, worker): process indices [begin, end); worker is in [0, threads()) and is
  /// unique among the chunks running at the same time (for per-worker scratch memory).
  using ChunkFn = std::function<void(int64_t begin, int64_t end, unsigned worker)>;

  /// @p threads >= 1 threads in all (the caller counts as one: threads − 1 workers are started).
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  unsigned threads() const noexcept { return n_threads_; }

  /// Runs fn over [0, n) in chunks of at least @p grain indices (at most threads() × 4 chunks)
  /// and waits for all of them. Runs inline (one chunk, worker 0) when n <= grain, with one
  /// thread, or when called from inside a running parallel_for (no nesting). The first
  /// exception thrown by a chunk is rethrown here after every started chunk has finished;
  /// chunks not yet started are skipped. Calls from several threads are serialised.
  void parallel_for(int64_t n, int64_t grain, const ChunkFn &fn);

  /// The thread count from EP_CPU_THREADS (a positive integer), else
  /// std::thread::hardware_concurrency() (at least 1).
  static unsigned default_threads();

 private:
  void worker_main(unsigned worker);
  /// Takes chunks of the current job until none are left (called with mu_ unlocked).
  void run_chunks(unsigned worker);

  unsigned n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one parallel_for at a time
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  // The current job (guarded by mu_, except fn_ which is read-only while a job runs).
  const ChunkFn *fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1, n_chunks_ = 0;
  int64_t next_ = 0, claimed_ = 0, finished_ = 0;  // chunks handed out / taken / done
  uint64_t generation_ = 0;
  bool failed_ = false;
  std::exception_ptr error_;
  bool stop_ = false;
  bool running_ = false;  // a job is in progress
};

}  // namespace ep
