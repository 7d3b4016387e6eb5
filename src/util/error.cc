#include "ckpt/error.h"

namespace ckpt {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kIo:
      return "io";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kTruncated:
      return "truncated";
    case ErrorCode::kCorrupt:
      return "corrupt";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kLimitExceeded:
      return "limit_exceeded";
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kAuth:
      return "auth";
  }
  return "unknown";
}

int exit_status(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kNotFound:
      return 2;
    case ErrorCode::kIo:
      return 3;
    case ErrorCode::kTruncated:
      return 4;
    case ErrorCode::kCorrupt:
      return 5;
    case ErrorCode::kUnsupported:
      return 6;
    case ErrorCode::kLimitExceeded:
      return 7;
    case ErrorCode::kInvalidArgument:
      return 8;
    case ErrorCode::kAuth:
      return 9;
  }
  return 1;
}

Error::Error(ErrorCode code, std::string message, std::string source, std::string record,
             std::optional<uint64_t> offset)
    : std::runtime_error(message),
      code_(code),
      message_(std::move(message)),
      source_(std::move(source)),
      record_(std::move(record)),
      offset_(offset) {
  rebuild();
}

Error& Error::with_source(const std::string& source) {
  if (source_.empty()) source_ = source;
  rebuild();
  return *this;
}
Error& Error::with_record(const std::string& record) {
  if (record_.empty()) record_ = record;
  rebuild();
  return *this;
}
Error& Error::with_offset(uint64_t offset) {
  if (!offset_) offset_ = offset;
  rebuild();
  return *this;
}
Error& Error::add_context(std::string what) {
  context_.push_back(std::move(what));
  rebuild();
  return *this;
}

void Error::rebuild() {
  std::string s;
  if (!source_.empty()) s += source_ + ": ";
  if (!record_.empty()) s += record_ + ": ";
  if (offset_) s += "at byte " + std::to_string(*offset_) + ": ";
  s += message_;
  if (!context_.empty()) {
    s += " (";
    for (size_t i = 0; i < context_.size(); ++i) s += (i ? "; while " : "while ") + context_[i];
    s += ")";
  }
  s += " [";
  s += error_code_name(code_);
  s += "]";
  // what() is a C string: a NUL from a file's name or key would end it there.
  for (size_t at; (at = s.find('\0')) != std::string::npos;) s.replace(at, 1, "\\x00");
  what_ = std::move(s);
}

}  // namespace ckpt
