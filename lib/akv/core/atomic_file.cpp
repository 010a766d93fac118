#include "akv/core/atomic_file.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>

#include "akv/core/errors.h"

namespace akv {
namespace {

// Temporary paths in flight, readable from a signal handler: fixed-size slots, no allocation.
constexpr int kSlots = 32;
constexpr std::size_t kPathMax = 4096;
struct Slot {
  std::atomic<bool> used{false};
  char path[kPathMax];
};
std::array<Slot, kSlots> g_slots;
std::mutex g_slots_mutex;
std::atomic<unsigned> g_counter{0};

int register_temp(const std::string& path) {
  if (path.size() >= kPathMax) return -1;
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (int i = 0; i < kSlots; ++i) {
    if (!g_slots[i].used.load()) {
      std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
      g_slots[i].used.store(true);
      return i;
    }
  }
  return -1;
}

void unregister_temp(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  g_slots[slot].used.store(false);
}

extern "C" void cleanup_and_reraise(int sig) {
  for (auto& s : g_slots) {
    if (s.used.load()) ::unlink(s.path);
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

AtomicOutput::AtomicOutput(std::string path) : path_(std::move(path)) {
  namespace fs = std::filesystem;
  if (path_.empty()) throw UsageError("empty output path");
  fs::path p(path_);
  fs::path dir = p.parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw IoError("output directory does not exist", {path_, "directory", dir.string()});
  }
  if (fs::is_directory(p, ec)) throw IoError("output path is a directory", {path_, "", ""});
  temp_ = (dir / ("." + p.filename().string() + ".akv-tmp-" + std::to_string(::getpid()) + "-" +
                  std::to_string(g_counter.fetch_add(1))))
              .string();
  slot_ = register_temp(temp_);
}

AtomicOutput::~AtomicOutput() {
  if (!committed_) std::remove(temp_.c_str());
  unregister_temp(slot_);
}

void AtomicOutput::commit() {
  if (std::rename(temp_.c_str(), path_.c_str()) != 0) {
    std::string reason = std::strerror(errno);
    std::remove(temp_.c_str());
    throw IoError("cannot rename temporary output into place: " + reason, {path_, "", ""});
  }
  committed_ = true;
}

void write_text_file(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::cout << text << std::flush;
    return;
  }
  AtomicOutput out(path);
  {
    std::ofstream f(out.temp_path(), std::ios::binary);
    if (!f) throw IoError("cannot create file: " + std::string(std::strerror(errno)), {path});
    f << text;
    f.flush();
    if (!f) throw IoError("cannot write file", {path});
  }
  out.commit();
}

void install_interrupt_cleanup() {
  std::signal(SIGINT, cleanup_and_reraise);
  std::signal(SIGTERM, cleanup_and_reraise);
  std::signal(SIGHUP, cleanup_and_reraise);
}

}  // namespace akv
