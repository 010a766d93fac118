#include "akv/core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace akv {

ProgressBar::ProgressBar(std::string label, bool enabled)
    : label_(std::move(label)), active_(enabled && ::isatty(STDERR_FILENO) == 1) {}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fputs("\r\033[K", stderr);
}

void ProgressBar::update(std::size_t done, std::size_t total) {
  if (!active_ || total == 0) return;
  auto now = std::chrono::steady_clock::now();
  if (done < total && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  constexpr int kWidth = 30;
  int filled = static_cast<int>(kWidth * done / total);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.append(static_cast<std::size_t>(kWidth - filled), '.');
  std::fprintf(stderr, "\r%s [%s] %zu/%zu", label_.c_str(), bar.c_str(), done, total);
  std::fflush(stderr);
  drawn_ = true;
}

ProgressFn ProgressBar::callback() {
  if (!active_) return {};
  return [this](std::size_t done, std::size_t total) { update(done, total); };
}

}  // namespace akv
