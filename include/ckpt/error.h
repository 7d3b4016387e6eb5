#pragma once
// Errors: one exception type with a code, the source (file) name, the record or tensor, the byte
// offset, and "while ..." context added on the way up.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ckpt {

// The one table of error codes: the library throws Error with a code, the CLI prints its name
// and exits with its status (docs/cli.md, docs/library.md repeat this table).
//
//   code               name              exit  meaning
//   kIo                io                   3  the OS refused a read, write, open, mmap...
//   kNotFound          not_found            2  a file, record, tensor or key that should exist
//   kTruncated         truncated            4  the data ends before a structure it declares,
//                                              wherever it is cut; an empty file too
//   kCorrupt           corrupt              5  bytes that cannot be what the format says (bad
//                                              magic, CRC, opcode); also a failed verify
//   kUnsupported       unsupported          6  valid but not handled (unknown global, dtype...)
//   kLimitExceeded     limit_exceeded       7  a configurable Limits field was hit
//   kInvalidArgument   invalid_argument     8  the caller asked for something impossible
//   kAuth              auth                 9  a wrong key or password, or tampered ciphertext
//   (CLI only)         not_verified        10  `verify` checked nothing (no checksums stored)
//   (CLI only)                             64  usage error (unknown flag, missing argument)
//   (CLI only)                    129, 130, 143  interrupted by SIGHUP, SIGINT, SIGTERM
//   (CLI only)                              1  an unexpected failure that is no ckpt::Error
enum class ErrorCode {
  kIo,
  kNotFound,
  kTruncated,
  kCorrupt,
  kUnsupported,
  kLimitExceeded,
  kInvalidArgument,
  kAuth,
};

// Short lower-case name of a code ("corrupt"), stable: used in CLI output and JSON.
const char* error_code_name(ErrorCode code) noexcept;
// The CLI's exit status for a code (table above), stable.
int exit_status(ErrorCode code) noexcept;

// Thread-safety: an Error is a value; copies are independent.
class Error : public std::runtime_error {
 public:
  explicit Error(ErrorCode code, std::string message, std::string source = {},
                 std::string record = {}, std::optional<uint64_t> offset = std::nullopt);

  ErrorCode code() const noexcept { return code_; }
  // The bare message, without source/record/offset/context.
  const std::string& message() const noexcept { return message_; }
  const std::string& source() const noexcept { return source_; }
  const std::string& record() const noexcept { return record_; }
  std::optional<uint64_t> offset() const noexcept { return offset_; }
  const std::vector<std::string>& context() const noexcept { return context_; }

  // Fill in fields that are still empty (callers higher up know the file or record name).
  Error& with_source(const std::string& source);
  Error& with_record(const std::string& record);
  Error& with_offset(uint64_t offset);
  // Adds "while <what>" context (innermost first).
  Error& add_context(std::string what);

  // "<source>: <record>: at byte <offset>: <message> (while a; while b) [code]"
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  void rebuild();
  ErrorCode code_;
  std::string message_, source_, record_;
  std::optional<uint64_t> offset_;
  std::vector<std::string> context_;
  std::string what_;
};

}  // namespace ckpt
