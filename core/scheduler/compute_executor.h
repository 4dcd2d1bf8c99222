// ComputeExecutor: the one thread that computes on session state.
//
// Every computation on sessions — the attention Scheduler's rounds and the
// GenerationEngine's iterations — runs here, one at a time, so a server
// has one worker and one OpenMP team (the kernels' and oneDNN's threads
// are this thread's team): two services busy at once share the cores
// instead of oversubscribing them.
//
// Work comes from sources. The worker takes them in turn, one unit of work
// (a round, an iteration) from each that has any, so neither service can
// starve the other: with both busy, a Decode step waits for at most one
// generation iteration and a Generate token for at most one attention
// round. With no work anywhere it sleeps until a source calls Wake(), or at
// most `idle_poll` (sources look then at what nothing signals, such as a
// caller's deadline passing).
//
// Thread-safe. Sources are added before they can get work and removed
// before they are destroyed.
#ifndef LINATTN_CORE_SCHEDULER_COMPUTE_EXECUTOR_H_
#define LINATTN_CORE_SCHEDULER_COMPUTE_EXECUTOR_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace linattn {

class ComputeExecutor {
 public:
  class Source {
   public:
    virtual ~Source() = default;
    // Runs one unit of work if there is any, without waiting for work to
    // arrive; returns whether it did any.
    virtual bool RunOnce() = 0;
  };

  // `threads`: the OpenMP team's size (0 = OpenMP's default, one per core
  // unless OMP_NUM_THREADS says otherwise).
  explicit ComputeExecutor(
      int threads = 0,
      std::chrono::milliseconds idle_poll = std::chrono::milliseconds(100));
  // Stops the worker. Sources must have been removed.
  ~ComputeExecutor();
  ComputeExecutor(const ComputeExecutor&) = delete;
  ComputeExecutor& operator=(const ComputeExecutor&) = delete;

  void Add(Source* source);
  // Returns once `source` is not running and will not run again. Not to be
  // called on the worker.
  void Remove(Source* source);
  // A source has work (or something its work waits for changed).
  void Wake();

  bool OnWorker() const { return std::this_thread::get_id() == worker_id_; }
  // The OpenMP threads the worker's team has (its default, restored after
  // a source narrows it for small work).
  int max_threads() const { return max_threads_; }
  // Units of work run so far.
  uint64_t units() const;

 private:
  void Loop();

  const std::chrono::milliseconds idle_poll_;
  mutable std::mutex mu_;
  std::condition_variable wake_cv_;  // wakes_ moved, or stopping_
  std::condition_variable idle_cv_;  // running_ changed
  std::vector<Source*> sources_;
  Source* running_ = nullptr;
  uint64_t wakes_ = 0;
  uint64_t units_ = 0;
  bool stopping_ = false;
  int max_threads_ = 1;
  std::thread::id worker_id_;
  std::thread worker_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_SCHEDULER_COMPUTE_EXECUTOR_H_
