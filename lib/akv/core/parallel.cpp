#include "akv/core/parallel.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>

namespace akv::detail {
namespace {

thread_local bool in_pool_thread = false;

// How long an idle helper, or a caller waiting for its helpers, polls before it sleeps on a
// condition variable: back-to-back calls (a decode step calls once per layer) then start without
// a futex wake-up (tens of microseconds on a VM).
constexpr auto kSpin = std::chrono::microseconds(100);

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls cond() until it holds or kSpin has passed (at once when !spin); returns its last value.
template <typename Cond>
bool spin_until(Cond cond, bool spin = true) {
  if (!spin) return cond();
  const auto end = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (cond()) return true;
    if (i % 64 == 63 && std::chrono::steady_clock::now() >= end) return cond();
    relax();
  }
}

// Helper threads waiting for jobs. A job is published as state_ = (generation << 32) | slots:
// a helper claims a slot with a compare-exchange, which also proves that run_/ctx_ belong to
// that generation (they change only after every claimed slot of the job has finished, which
// the caller waits for through pending_).
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
    while (threads_.size() < helpers) threads_.emplace_back([this] { loop(); });
    // More threads than cores: idle helpers would poll on cores the caller needs.
    spin_.store(threads_.size() < std::max(1u, std::thread::hardware_concurrency()), std::memory_order_relaxed);
    run_ = run;
    ctx_ = ctx;
    pending_.store(helpers, std::memory_order_relaxed);
    const std::uint64_t gen = (state_.load(std::memory_order_relaxed) >> 32) + 1;
    {
      std::lock_guard<std::mutex> lock(m_);  // a helper about to sleep sees the new state
      state_.store((gen << 32) | helpers, std::memory_order_release);
    }
    work_.notify_all();
    run(ctx);
    if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lock(m_);
      done_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    return true;
  }

 private:
  void loop() {
    in_pool_thread = true;
    std::uint64_t seen = 0;  // last generation this thread looked at
    for (;;) {
      auto fresh = [&] { return (state_.load(std::memory_order_acquire) >> 32) != seen; };
      if (!spin_until(fresh, spin_.load(std::memory_order_relaxed))) {
        std::unique_lock<std::mutex> lock(m_);
        work_.wait(lock, [&] { return stop_ || fresh(); });
        if (stop_) return;
      }
      std::uint64_t s = state_.load(std::memory_order_acquire);
      seen = s >> 32;
      while ((s & 0xffffffffu) != 0) {
        if (state_.compare_exchange_weak(s, s - 1, std::memory_order_acq_rel)) {
          run_(ctx_);
          if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            std::lock_guard<std::mutex> lock(m_);
            done_.notify_one();
          }
          break;
        }
        if ((s >> 32) != seen) break;  // a newer job: look again
      }
    }
  }

  std::mutex busy_;  // held by the caller of the job in flight
  std::mutex m_;
  std::condition_variable work_, done_;
  std::vector<std::thread> threads_;  // touched by the caller holding busy_ only
  void (*run_)(void*) = nullptr;
  void* ctx_ = nullptr;
  std::atomic<std::uint64_t> state_{0};
  std::atomic<std::size_t> pending_{0};
  std::atomic<bool> spin_{true};  // helpers poll before sleeping (threads < cores)
  bool stop_ = false;  // guarded by m_
};

}  // namespace

bool pool_run(std::size_t helpers, void (*run)(void*), void* ctx) {
  if (in_pool_thread) return false;
  static Pool pool;
  return pool.run(helpers, run, ctx);
}

}  // namespace akv::detail
