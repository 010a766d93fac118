// akv: one binary, subcommands registered here. Library errors are typed; they are caught once,
// printed as "akv: error: <what> (<file>: <field> = <value>)" and mapped to the exit code:
// 0 success, 1 usage error, 2 invalid or corrupt input, 3 I/O failure.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "akv/core/atomic_file.h"
#include "akv/core/errors.h"
#include "akv/core/isa.h"
#include "akv/core/parallel.h"
#include "akv/core/version.h"
#include "commands.h"

namespace {

// Messages can quote input (a flag's value, a token): one line, at most a few KB, always.
int fail(const std::string& message, akv::ExitCode code) {
  std::fprintf(stderr, "akv: error: %s\n", akv::excerpt(message, 8192).c_str());
  if (akv::quick_exit_requested()) {  // see akv::request_quick_exit
    akv::remove_registered_temporaries();
    std::fflush(nullptr);
    std::_Exit(static_cast<int>(code));
  }
  return static_cast<int>(code);
}

// glibc serves blocks from 128 KiB (its threshold rising to 32 MiB) by mmap and returns freed
// memory past its trim threshold to the kernel: calibrate's nuq fits allocate and free tens of
// MB a layer, so every layer paid for fresh zeroed pages (a sixth of its wall time on a
// 1B-shaped dump; docs/calibrate.md). Keep up to 256 MiB of freed heap and map blocks from 64
// MiB, unless the environment sets glibc's allocator tunables itself.
void keep_freed_memory() {
#ifdef __GLIBC__
  for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(v)) return;
  }
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  akv::install_interrupt_cleanup();
  keep_freed_memory();
  CLI::App app{"akv: KV-cache compression toolkit for transformer LLMs.\n"
               "Exit codes: 0 success, 1 usage error, 2 invalid or corrupt input, 3 I/O failure.",
               "akv"};
  app.formatter(std::make_shared<akv::cli::SummaryFormatter>());
  app.set_version_flag("--version", "akv " + akv::version() + " (commit " + akv::git_commit() + ")");
  app.require_subcommand(1);
  app.fallthrough();

  akv::cli::GlobalOptions global;
  app.add_flag("-q,--quiet", global.quiet, "Do not draw progress bars on stderr");
  // Commands read the resolved count: 0 (the default) becomes the hardware thread count here.
  global.threads = akv::resolve_threads(0);
  app.add_option("-t,--threads", global.threads, "Worker threads (0 = all hardware threads; default: all)")
      ->check(CLI::Range(0, 4096))
      ->transform(CLI::Validator(
          [](std::string& v) {
            if (v == "0") v = std::to_string(akv::resolve_threads(0));
            return std::string();
          },
          "", "threads"));

  // The vector kernels give the same bits with AVX-512 and AVX2 (tested), so the cap changes
  // speed only: for timing AVX2 code on an AVX-512 machine. The plain loops agree within float
  // rounding (docs/attention.md).
  std::string max_isa = "best";
  app.add_option("--max-isa", max_isa,
                 "Highest instruction set of the vector kernels (decode attention, int8 attention, weight "
                 "products): best (what the CPU has), avx512, avx2 or generic (plain loops). avx512 and avx2 give "
                 "the same results bit for bit; generic agrees within float rounding")
      ->capture_default_str()
      ->check(CLI::IsMember({"best", "avx512", "avx2", "generic"}))
      ->each([](const std::string& v) {
        akv::set_isa(v == "generic" ? akv::Isa::generic : v == "avx2" ? akv::Isa::avx2 : akv::Isa::avx512);
      });

  akv::cli::register_info(app, global);
  akv::cli::register_synth(app, global);
  akv::cli::register_dump(app, global);
  akv::cli::register_calibrate(app, global);
  akv::cli::register_allocate(app, global);
  akv::cli::register_compress(app, global);
  akv::cli::register_decompress(app, global);
  akv::cli::register_evaluate(app, global);
  akv::cli::register_bench(app, global);
  akv::cli::register_plan(app, global);
  akv::cli::register_merge(app, global);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion&) {
    std::printf("%s\n", app.version().c_str());
    return 0;
  } catch (const CLI::ValidationError& e) {
    // A value outside a flag's range or set of names (CLI11's validators): invalid input.
    return fail(std::string(e.what()) + " (run 'akv --help')", akv::ExitCode::invalid_input);
  } catch (const CLI::ParseError& e) {
    return fail(std::string(e.what()) + " (run 'akv --help')", akv::ExitCode::usage);
  } catch (const akv::Error& e) {
    return fail(e.what(), e.exit_code());
  } catch (const std::bad_alloc&) {
    return fail("out of memory", akv::ExitCode::io);
  } catch (const std::exception& e) {
    return fail(std::string("internal error: ") + e.what(), akv::ExitCode::io);
  }
  return 0;
}
