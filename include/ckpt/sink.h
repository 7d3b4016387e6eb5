#pragma once
// ByteSink: where writers put bytes. Sequential writes, positional patches of bytes already
// written, and an atomic commit.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ckpt {

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual const std::string& name() const = 0;
  // Appends bytes. Throws Error{kIo}.
  virtual void write(std::span<const std::byte> bytes) = 0;
  void write(std::string_view s) {
    write(std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size()));
  }
  // Overwrites bytes already written at [offset, offset + bytes.size()). Throws Error{kIo} or
  // Error{kInvalidArgument} when the range was not written yet.
  virtual void patch(uint64_t offset, std::span<const std::byte> bytes) = 0;
  // Bytes written so far.
  virtual uint64_t position() const = 0;
  // Makes the result visible (for a file: fsync, rename over the target, fsync the folder).
  // Nothing is visible under the target name before this returns.
  virtual void commit() = 0;
};

struct FileSinkOptions {
  bool atomic = true;  // write "<dir>/.<name>.tmp-XXXXXX", rename on commit
  bool fsync = true;   // fsync file and folder on commit
};
// A file sink. If destroyed without commit(), the temporary file is removed and the target is
// untouched. Throws Error{kIo}.
std::unique_ptr<ByteSink> create_file_sink(const std::string& path, FileSinkOptions options = {});

// A sink in memory; commit() is a no-op. bytes() is valid until the sink dies.
class MemorySink final : public ByteSink {
 public:
  explicit MemorySink(std::string name = "<memory>") : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  void write(std::span<const std::byte> bytes) override;
  using ByteSink::write;
  void patch(uint64_t offset, std::span<const std::byte> bytes) override;
  uint64_t position() const override { return buf_.size(); }
  void commit() override {}
  const std::vector<std::byte>& bytes() const { return buf_; }
  std::vector<std::byte> take() { return std::move(buf_); }

 private:
  std::string name_;
  std::vector<std::byte> buf_;
};

}  // namespace ckpt
