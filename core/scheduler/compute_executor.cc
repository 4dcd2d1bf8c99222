#include "core/scheduler/compute_executor.h"

#include <omp.h>

#include <algorithm>

namespace linattn {

ComputeExecutor::ComputeExecutor(int threads,
                                 std::chrono::milliseconds idle_poll)
    : idle_poll_(idle_poll) {
  std::unique_lock<std::mutex> lock(mu_);
  bool started = false;
  worker_ = std::thread([this, threads, &started] {
    // The team size is a property of the thread that opens the regions.
    if (threads > 0) omp_set_num_threads(threads);
    {
      std::lock_guard<std::mutex> started_lock(mu_);
      worker_id_ = std::this_thread::get_id();
      max_threads_ = omp_get_max_threads();
      started = true;
    }
    idle_cv_.notify_all();
    Loop();
  });
  idle_cv_.wait(lock, [&] { return started; });
}

ComputeExecutor::~ComputeExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_cv_.notify_all();
  worker_.join();
}

void ComputeExecutor::Add(Source* source) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    sources_.push_back(source);
    ++wakes_;
  }
  wake_cv_.notify_all();
}

void ComputeExecutor::Remove(Source* source) {
  std::unique_lock<std::mutex> lock(mu_);
  sources_.erase(std::remove(sources_.begin(), sources_.end(), source),
                 sources_.end());
  idle_cv_.wait(lock, [&] { return running_ != source; });
}

void ComputeExecutor::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++wakes_;
  }
  wake_cv_.notify_all();
}

uint64_t ComputeExecutor::units() const {
  std::lock_guard<std::mutex> lock(mu_);
  return units_;
}

void ComputeExecutor::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<Source*> pass;
  while (!stopping_) {
    const uint64_t seen = wakes_;
    bool worked = false;
    // One pass: each source once, in the order they were added, so with
    // every source busy they strictly alternate.
    pass = sources_;
    for (Source* source : pass) {
      if (stopping_) break;
      // Removed during the pass: not run again.
      if (std::find(sources_.begin(), sources_.end(), source) ==
          sources_.end()) {
        continue;
      }
      running_ = source;
      lock.unlock();
      const bool did = source->RunOnce();
      // A source may narrow the team for small work; the next one gets it
      // whole.
      omp_set_num_threads(max_threads_);
      lock.lock();
      running_ = nullptr;
      idle_cv_.notify_all();
      if (did) {
        ++units_;
        worked = true;
      }
    }
    if (!worked) {
      wake_cv_.wait_for(lock, idle_poll_,
                        [&] { return stopping_ || wakes_ != seen; });
    }
  }
}

}  // namespace linattn
