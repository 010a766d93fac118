#pragma once
// Shared by the libFuzzer harnesses (docs/fuzzing.md). A harness hands the input to one akv reader
// the way the CLI does (through a file) and returns normally when the reader accepts it or throws
// an akv::Error (the CLI's exit 1/2/3 with a one-line message). Anything else is a finding:
// another exception type (std::bad_alloc, a JSON library error: the CLI's "internal error"), a
// crash, a sanitizer report, a leak, an allocation over libFuzzer's -malloc_limit_mb or a hang.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "akv/core/errors.h"

namespace akv::fuzz {

// A private directory for this process's input files (under $TMPDIR, else /tmp), created once.
const std::string& work_dir();

// std::filesystem::copy_file (overwriting), tried again when a signal interrupts it (EINTR):
// libFuzzer's timers interrupt the kernel's file copy now and then.
void copy_file_retrying(const std::string& from, const std::string& to);

// Writes `size` bytes to `name` inside work_dir() and returns the file's path.
std::string write_input(const std::string& name, const std::uint8_t* data, std::size_t size);
std::string write_input(const std::string& name, const std::string& text);

// Runs `fn`; akv errors are the accepted outcome of bad input. Other exceptions abort with the
// exception's text so that libFuzzer records the input as a crash.
template <class Fn>
void expect_akv_errors(Fn&& fn) {
  try {
    fn();
  } catch (const akv::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "akv-fuzz: exception other than akv::Error: %s\n", e.what());
    std::abort();
  }
}

// The directory of the committed format fixtures (data/fixtures), set at build time.
std::string fixtures_dir();

}  // namespace akv::fuzz
