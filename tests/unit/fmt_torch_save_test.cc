// save_torch through a file sink (large storages written in slices from two threads, the storage
// records preallocated) against the same save through a MemorySink (the sequential defaults):
// byte-identical, and every CRC right.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>

#include "ckpt/ckpt.h"
#include "test_util.h"

namespace ckpt {
namespace {

Tensor bytes_tensor(const std::string& name, size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return Tensor::copy_of(name, DType::kUInt8, {static_cast<int64_t>(n)}, v);
}

TEST(TorchSave, FileAndMemorySinksWriteTheSameBytes) {
  constexpr size_t kMiB = 1 << 20;
  // Sizes around the 1 MiB slice and the 4-slice threshold of the two-thread path, odd tails.
  std::vector<Tensor> ts = {
      bytes_tensor("small", 100, 1),        bytes_tensor("slice", kMiB, 2),
      bytes_tensor("two", kMiB + 3, 3),     bytes_tensor("four", 4 * kMiB, 4),
      bytes_tensor("empty", 0, 5),          bytes_tensor("odd", 13 * kMiB / 2 + 1, 6),
      bytes_tensor("big", 11 * kMiB + 5, 7)};
  test::TempDir dir;
  std::string path = dir.file("model.pt");
  SaveOptions so;
  so.fsync = false;
  save_torch(path, state_dict_value(ts), ts, so);

  MemorySink mem;
  SaveOptions mo;
  mo.archive_name = "model";  // what the file save derives from its name
  save_torch(mem, state_dict_value(ts), ts, mo);
  EXPECT_EQ(test::read_file(path), mem.bytes());

  // The preallocation covered the storage records only: no blocks left past the end.
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), mem.bytes().size());
  EXPECT_LE(static_cast<uint64_t>(st.st_blocks) * 512, static_cast<uint64_t>(st.st_size) + kMiB);

  Checkpoint c = Checkpoint::open(path);
  EXPECT_EQ(c.verify(), c.records().size());
  LoadOptions lo;
  lo.verify = true;
  auto back = c.load_all(lo);
  ASSERT_EQ(back.size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = c.tensor(ts[i].name());
    ASSERT_EQ(t.info().nbytes(), ts[i].info().nbytes()) << ts[i].name();
    if (t.info().nbytes() > 0) {
      EXPECT_EQ(std::memcmp(t.data(), ts[i].data(), t.info().nbytes()), 0) << ts[i].name();
    }
  }
}

// A write that fails while a large storage is written from two threads (here: past
// RLIMIT_FSIZE, EFBIG) is an Error{kIo} naming the file; no temporary file is left, and the
// target keeps its old contents.
TEST(TorchSave, FailedWriteLeavesTheOldFile) {
  constexpr size_t kMiB = 1 << 20;
  test::TempDir dir;
  std::string path = dir.file("model.pt");
  std::vector<Tensor> small = {bytes_tensor("a", 100, 1)};
  save_torch(path, state_dict_value(small), small);
  const auto before = test::read_file(path);

  std::vector<Tensor> ts = {bytes_tensor("a", 3 * kMiB, 1), bytes_tensor("b", 16 * kMiB, 2)};
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // write() returns EFBIG instead of a signal
  struct rlimit limit = old;
  limit.rlim_cur = 9 * kMiB;  // inside "b"
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  Error e = test::capture_error([&] { save_torch(path, state_dict_value(ts), ts); });
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(e.code(), ErrorCode::kIo);
  EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  EXPECT_EQ(test::read_file(path), before);
  size_t files = 0;
  for (auto& f : std::filesystem::directory_iterator(dir.path())) (void)f, ++files;
  EXPECT_EQ(files, 1u);  // no temporary left behind
}

}  // namespace
}  // namespace ckpt
