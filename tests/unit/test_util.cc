#include "test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace ckpt::test {

std::vector<std::byte> to_bytes(std::string_view s) {
  auto p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}
std::string to_string(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

namespace {
class Faulty final : public ByteSource {
 public:
  Faulty(std::vector<std::byte> b, FaultySourceOptions o, std::string n)
      : bytes_(std::move(b)), opt_(o), name_(std::move(n)) {}
  uint64_t size() const override { return bytes_.size(); }
  const std::string& name() const override { return name_; }
  void read_into(uint64_t offset, std::span<std::byte> dst) const override {
    check_range(offset, dst.size());
    uint64_t n = stats().reads.load() + 1;
    count(dst.size());
    if (opt_.fail_on_read && n == opt_.fail_on_read)
      throw Error(ErrorCode::kIo, "injected read failure", name_, {}, offset);
    if (offset + dst.size() > opt_.truncate_at)
      throw Error(ErrorCode::kTruncated, "injected short read", name_, {}, opt_.truncate_at);
    if (!dst.empty()) std::memcpy(dst.data(), bytes_.data() + offset, dst.size());
  }

 private:
  std::vector<std::byte> bytes_;
  FaultySourceOptions opt_;
  std::string name_;
};
}  // namespace

SourcePtr faulty_source(std::vector<std::byte> bytes, FaultySourceOptions opt, std::string name) {
  return std::make_shared<Faulty>(std::move(bytes), opt, std::move(name));
}

Error capture_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a ckpt::Error";
  return Error(ErrorCode::kInvalidArgument, "no error thrown");
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ckpt-test-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  path_ = buf.data();
}
TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void write_file(const std::string& path, std::span<const std::byte> bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto p = reinterpret_cast<const std::byte*>(c.data());
  return {p, p + c.size()};
}

std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return v;
}

Tensor make_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                   uint32_t seed) {
  uint64_t n = dtype_size(dtype);
  for (auto d : shape) n *= static_cast<uint64_t>(d);
  return Tensor::copy_of(name, dtype, std::move(shape), pattern(n, seed));
}

}  // namespace ckpt::test
