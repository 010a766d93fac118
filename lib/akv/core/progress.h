#pragma once
// A progress bar on stderr, drawn only when enabled and stderr is a terminal. Library code
// reports through the ProgressFn callback and never prints.
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

namespace akv {

// Called with (units done, units total) as work advances; may be empty.
using ProgressFn = std::function<void(std::size_t done, std::size_t total)>;

class ProgressBar {
 public:
  // `enabled` is the caller's wish (e.g. !--quiet); the bar also stays silent unless stderr is a
  // terminal, so logs and pipes never see it.
  ProgressBar(std::string label, bool enabled);
  ~ProgressBar();
  void update(std::size_t done, std::size_t total);
  ProgressFn callback();
  bool active() const { return active_; }

 private:
  std::string label_;
  bool active_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace akv
