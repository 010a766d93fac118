#include "akv/core/parallel.h"

#include <condition_variable>
#include <cstdint>

namespace akv::detail {
namespace {

thread_local bool in_pool_thread = false;

// Helper threads waiting for jobs. A job is (run, ctx) offered to `slots` threads; the caller
// waits until `active` of them have finished.
class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    work_.notify_all();
    for (auto& t : threads_) t.join();
  }

  bool run(std::size_t helpers, void (*run)(void*), void* ctx) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(m_);
      while (threads_.size() < helpers) threads_.emplace_back([this] { loop(); });
      run_ = run;
      ctx_ = ctx;
      slots_ = helpers;
      active_ = helpers;
    }
    work_.notify_all();
    run(ctx);
    std::unique_lock<std::mutex> lock(m_);
    done_.wait(lock, [this] { return active_ == 0; });
    return true;
  }

 private:
  void loop() {
    in_pool_thread = true;
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      work_.wait(lock, [this] { return stop_ || slots_ > 0; });
      if (stop_) return;
      --slots_;
      void (*run)(void*) = run_;
      void* ctx = ctx_;
      lock.unlock();
      run(ctx);
      lock.lock();
      if (--active_ == 0) done_.notify_one();
    }
  }

  std::mutex busy_;  // held by the caller of the job in flight
  std::mutex m_;
  std::condition_variable work_, done_;
  std::vector<std::thread> threads_;
  void (*run_)(void*) = nullptr;
  void* ctx_ = nullptr;
  std::size_t slots_ = 0, active_ = 0;
  bool stop_ = false;
};

}  // namespace

bool pool_run(std::size_t helpers, void (*run)(void*), void* ctx) {
  if (in_pool_thread) return false;
  static Pool pool;
  return pool.run(helpers, run, ctx);
}

}  // namespace akv::detail
