#pragma once
// Outputs are never left half-written: a writer creates a temporary file next to the target
// (same directory, so the final rename is atomic), and the target appears only on commit().
// A destroyed, uncommitted AtomicOutput removes its temporary file; a fatal signal removes every
// temporary file still registered (install_interrupt_cleanup()).
//
// Targets: a new path or an existing regular file is replaced by the rename; a symbolic link is
// followed (the file it names is replaced, the link stays). An existing target that is not a
// regular file (a device such as /dev/null, a FIFO, a socket) cannot take a rename: file outputs
// (HDF5) refuse it, text outputs (write_text_file) write straight into it.
#include <string>
#include <vector>

namespace akv {

class AtomicOutput {
 public:
  // Plans the output `path` and creates its temporary file (exclusively, O_EXCL | O_NOFOLLOW,
  // under a random name beside it, permissions 0666 less the umask). Throws IoError if the
  // directory is missing or not writable, or the target exists and is not a regular file.
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

// Writes `text` to `path` atomically; "-" writes to stdout, and an existing target that is not
// a regular file (/dev/stdout, a FIFO) is written to directly.
void write_text_file(const std::string& path, const std::string& text);

// Whether `path` names standard output: "-", or a file that is standard output's (/dev/stdout,
// /proc/self/fd/1, or the file stdout is redirected to). A command that prints a table after
// writing its JSON to -o prints nothing more then, so the JSON stands alone.
bool names_stdout(const std::string& path);

// Throws UsageError naming the output when it is the same file as one of the inputs (by path or
// through links), before anything is written. Empty paths and "-" are ignored.
void check_output_distinct(const std::string& output, const std::vector<std::string>& inputs);

// Installs handlers for fatal signals (INT, TERM, HUP, QUIT, PIPE, ALRM, USR1, USR2) that remove
// registered temporary files and then re-raise the signal with its default action (so the exit
// status tells the signal). SIGXFSZ (a file-size limit) is ignored, so the write that crosses
// the limit fails with EFBIG and ends as an I/O error (exit 3) with its file removed.
void install_interrupt_cleanup();

// A library that cannot shut down cleanly after an error (HDF5 holding a file it failed to
// close) asks the process to end without running exit handlers; main then flushes its streams,
// removes registered temporary files and calls std::_Exit with its exit code.
void request_quick_exit();
bool quick_exit_requested();
void remove_registered_temporaries();

}  // namespace akv
