#include "akv/core/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
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
#include <random>

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

std::atomic<bool> g_quick_exit{false};

void unlink_registered() {
  for (auto& s : g_slots) {
    if (s.used.load()) ::unlink(s.path);
  }
}

extern "C" void cleanup_and_reraise(int sig) {
  unlink_registered();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

AtomicOutput::AtomicOutput(std::string path) : path_(std::move(path)) {
  namespace fs = std::filesystem;
  if (path_.empty()) throw UsageError("empty output path");
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path_, ec))) {
    // Replace the file the link names, never the link (the temporary file must sit beside it).
    const fs::path target = fs::weakly_canonical(path_, ec);
    if (ec) throw IoError("cannot resolve the output's symbolic link: " + ec.message(), {path_, "", ""});
    path_ = target.string();
  }
  const fs::file_status st = fs::status(path_, ec);
  if (fs::exists(st) && !fs::is_regular_file(st) && !fs::is_directory(st)) {
    throw IoError("output exists and is not a regular file (it cannot be replaced)", {path_, "", ""});
  }
  fs::path p(path_);
  fs::path dir = p.parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec)) {
    throw IoError("output directory does not exist", {path_, "directory", dir.string()});
  }
  if (fs::is_directory(p, ec)) throw IoError("output path is a directory", {path_, "", ""});
  // The temporary file is created here, exclusively and under an unpredictable name, so that
  // nothing planted in the directory beforehand (a symbolic link, a file of another user) is
  // followed or overwritten. Writers then open it by name.
  std::random_device random;
  for (int attempt = 0;; ++attempt) {
    const std::uint64_t r = (std::uint64_t{random()} << 32) ^ random() ^ (std::uint64_t{g_counter.fetch_add(1)} << 16);
    temp_ = (dir / ("." + p.filename().string() + ".akv-tmp-" + fmt::format("{:016x}", r))).string();
    const int fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) {
      ::close(fd);
      break;
    }
    if (errno != EEXIST || attempt == 99) {
      throw IoError("cannot create file: " + std::string(std::strerror(errno)), {path_, "directory", dir.string()});
    }
  }
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
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st) && !fs::is_regular_file(st) && !fs::is_directory(st)) {
    // A device or FIFO (/dev/stdout, a pipe): nothing to replace, write through.
    std::ofstream f(path, std::ios::binary);
    if (!f) throw IoError("cannot open output: " + std::string(std::strerror(errno)), {path});
    f << text;
    f.flush();
    if (!f) throw IoError("cannot write output", {path});
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

bool names_stdout(const std::string& path) {
  if (path == "-") return true;
  struct stat out {}, named {};
  return !path.empty() && ::fstat(STDOUT_FILENO, &out) == 0 && ::stat(path.c_str(), &named) == 0 &&
         out.st_dev == named.st_dev && out.st_ino == named.st_ino;
}

void check_output_distinct(const std::string& output, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  if (output.empty() || output == "-") return;
  for (const std::string& in : inputs) {
    if (in.empty() || in == "-") continue;
    std::error_code ec;
    if (fs::equivalent(output, in, ec) && !ec) {
      throw UsageError("the output is an input file; refusing to replace it", {output, "input", in});
    }
  }
}

void request_quick_exit() { g_quick_exit.store(true); }
bool quick_exit_requested() { return g_quick_exit.load(); }
void remove_registered_temporaries() { unlink_registered(); }

void install_interrupt_cleanup() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGALRM, SIGUSR1, SIGUSR2}) {
    std::signal(sig, cleanup_and_reraise);
  }
  std::signal(SIGXFSZ, SIG_IGN);
}

}  // namespace akv
