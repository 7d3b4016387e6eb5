#pragma once
// Test helpers: byte builders, a faulty source, corruptors.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/source.h"
#include "ckpt/tensor.h"

namespace ckpt::test {

std::vector<std::byte> to_bytes(std::string_view s);
std::string to_string(std::span<const std::byte> b);

// A source over memory that can fail: on the Nth read (1-based; 0 = never), or return data only
// up to `truncate_at` bytes.
struct FaultySourceOptions {
  uint64_t fail_on_read = 0;
  uint64_t truncate_at = UINT64_MAX;
};
SourcePtr faulty_source(std::vector<std::byte> bytes, FaultySourceOptions opt,
                        std::string name = "<faulty>");

// Runs fn and returns the Error it throws; fails the test if it throws nothing or something else.
Error capture_error(const std::function<void()>& fn);

// A temporary directory removed at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_file(const std::string& path, std::span<const std::byte> bytes);

// `n` pseudo-random bytes, the same for the same `seed`.
std::vector<std::byte> pattern(size_t n, uint32_t seed);
// A tensor that owns its bytes, filled with pattern(nbytes, seed).
Tensor make_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape, uint32_t seed);
std::vector<std::byte> read_file(const std::string& path);

}  // namespace ckpt::test

// EXPECT that `stmt` throws ckpt::Error with code `code_`.
#define EXPECT_CKPT_ERROR(stmt, code_)                                            \
  do {                                                                            \
    try {                                                                         \
      stmt;                                                                       \
      ADD_FAILURE() << "expected ckpt::Error " << ::ckpt::error_code_name(code_); \
    } catch (const ::ckpt::Error& e_) {                                           \
      EXPECT_EQ(e_.code(), code_) << e_.what();                                   \
    }                                                                             \
  } while (0)
