#pragma once
// parallel_for over independent items. Work items must not depend on which thread runs them;
// then results are identical for any thread count. The first exception thrown by any item is
// rethrown on the calling thread after all threads stop.
//
// Helper threads come from a process-wide pool that lives until exit (started on first use,
// grown to the largest count asked for): a call costs a wake-up, not a thread start (~50 us
// each, which dominated short decode-attention calls). A parallel_for issued from inside a pool
// thread, or while another thread's parallel_for holds the pool, starts its own threads.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace akv {

// Number of threads to use when the user asked for `requested` (0 = all hardware threads).
inline int resolve_threads(int requested) {
  if (requested > 0) return requested;
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

namespace detail {
// Runs run(ctx) on `helpers` pool threads and on the calling thread, and returns true after all
// of them returned; returns false without running anything when the pool is not free (see
// above). run must not throw.
bool pool_run(std::size_t helpers, void (*run)(void*), void* ctx);
}  // namespace detail

// Calls fn(i) for i in [0, n) on up to n_threads threads (dynamic scheduling).
template <typename Fn>
void parallel_for(std::size_t n, int n_threads, Fn&& fn) {
  std::size_t workers = std::min<std::size_t>(n, static_cast<std::size_t>(std::max(1, n_threads)));
  if (workers <= 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&]() {
    for (;;) {
      std::size_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n);
        return;
      }
    }
  };
  auto run = [](void* w) { (*static_cast<decltype(work)*>(w))(); };
  if (detail::pool_run(workers - 1, run, &work)) {
    if (error) std::rethrow_exception(error);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (std::size_t t = 1; t < workers; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace akv
