#pragma once
// Outputs are never left half-written: a writer creates a temporary file next to the target
// (same directory, so the final rename is atomic), and the target appears only on commit().
// A destroyed, uncommitted AtomicOutput removes its temporary file; a SIGINT/SIGTERM/SIGHUP
// removes every temporary file still registered (install_interrupt_cleanup()).
#include <string>

namespace akv {

class AtomicOutput {
 public:
  // Plans the output `path`; creates nothing yet. Throws IoError if the directory is missing.
  explicit AtomicOutput(std::string path);
  ~AtomicOutput();
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;

  const std::string& path() const { return path_; }       // final name
  const std::string& temp_path() const { return temp_; }  // where to write until commit()

  // Renames the temporary file onto the final name. Throws IoError on failure.
  void commit();

 private:
  std::string path_;
  std::string temp_;
  int slot_ = -1;
  bool committed_ = false;
};

// Writes `text` to `path` atomically; "-" writes to stdout.
void write_text_file(const std::string& path, const std::string& text);

// Installs handlers for SIGINT, SIGTERM and SIGHUP that remove registered temporary files and
// then re-raise the signal with its default action (so the exit status tells the signal).
void install_interrupt_cleanup();

}  // namespace akv
