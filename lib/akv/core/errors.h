#pragma once
// Typed errors of akv. Library code throws; the CLI catches once in main and maps the type to
// an exit code: 1 usage, 2 invalid or corrupt input, 3 I/O failure. Messages are one line:
// "<what> (<file>: <field> = <value>)", the location part present when known.
#include <stdexcept>
#include <string>

namespace akv {

enum class ExitCode : int { ok = 0, usage = 1, invalid_input = 2, io = 3 };

// Where an error was found: the file, the field inside it (attribute, dataset, flag) and the
// offending value. Any part may be empty.
struct Where {
  Where() = default;
  Where(std::string file_, std::string field_ = {}, std::string value_ = {})
      : file(std::move(file_)), field(std::move(field_)), value(std::move(value_)) {}
  std::string file;
  std::string field;
  std::string value;
};

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& what, const Where& where = {});
  ExitCode exit_code() const { return code_; }
  const Where& where() const { return where_; }
  const std::string& message() const { return message_; }  // what() without the location

 private:
  ExitCode code_;
  Where where_;
  std::string message_;
};

// A flag or argument combination that cannot work (exit 1).
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what, const Where& where = {})
      : Error(ExitCode::usage, what, where) {}
};

// Input that is well-formed but not acceptable: wrong shape, out-of-range value (exit 2).
class InvalidInput : public Error {
 public:
  explicit InvalidInput(const std::string& what, const Where& where = {})
      : Error(ExitCode::invalid_input, what, where) {}
};

// Input that is damaged: truncated, not the format it claims, unreadable bytes (exit 2).
class CorruptData : public Error {
 public:
  explicit CorruptData(const std::string& what, const Where& where = {})
      : Error(ExitCode::invalid_input, what, where) {}
};

// The operating system refused: cannot open, create, write or rename a file (exit 3).
class IoError : public Error {
 public:
  explicit IoError(const std::string& what, const Where& where = {})
      : Error(ExitCode::io, what, where) {}
};

// A number for an error message: "%.9g" (shortest round-trip for f32), "nan", "inf", "-inf".
std::string format_number(double v);

// Text from an input shown in an error message, kept on one short line: control characters are
// escaped (\n, \t, \xNN) and text longer than `max` characters keeps its start and end with
// the length between them: "abc...xyz (52428800 bytes)".
std::string excerpt(const std::string& text, std::size_t max = 200);

// Formats "<what> (<file>: <field> = <value>)", leaving out the parts that are empty; the
// location parts pass through excerpt().
std::string format_error(const std::string& what, const Where& where);

}  // namespace akv
