// ByteSink's optional speed-ups: reserve() and write_sliced(), on the file sink (two threads,
// preallocation) and on the sequential defaults (MemorySink).

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <set>
#include <stdexcept>
#include <tuple>

#include "ckpt/error.h"
#include "ckpt/sink.h"
#include "test_util.h"

namespace ckpt {
namespace {

constexpr size_t kSlice = 1 << 20;

// Bytes that differ from slice to slice and within one, so a slice written at the wrong offset
// shows.
std::vector<std::byte> pattern(size_t n) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + i / 4093) & 0xFF);
  return v;
}

// Records the slices a write_sliced() call visits (from any thread).
struct Visits {
  std::mutex mu;
  std::set<std::tuple<size_t, uint64_t, size_t>> seen;  // index, offset, size
  size_t calls = 0;
  std::span<const std::byte> block;
  bool bytes_ok = true;

  ByteSink::SliceVisitor visitor() {
    return [this](size_t i, uint64_t off, std::span<const std::byte> s) {
      std::lock_guard<std::mutex> lock(mu);
      ++calls;
      seen.emplace(i, off, s.size());
      bytes_ok &= s.data() == block.data() + off;
    };
  }
  // Each slice of a block of `n` bytes written at sink position `start` visited exactly once, with
  // its own bytes; cuts where the position is a multiple of kSlice.
  void expect_every_slice(uint64_t start, size_t n) const {
    std::set<std::tuple<size_t, uint64_t, size_t>> want;
    size_t i = 0;
    for (uint64_t off = 0; off < n; ++i) {
      uint64_t next = std::min<uint64_t>(n, (start + off) / kSlice * kSlice + kSlice - start);
      want.emplace(i, off, next - off);
      off = next;
    }
    EXPECT_EQ(seen, want);
    EXPECT_EQ(calls, want.size());
    EXPECT_LE(calls, n / kSlice + 2);
    EXPECT_TRUE(bytes_ok);
  }
};

std::vector<std::byte> concat(std::string_view a, std::span<const std::byte> b,
                              std::string_view c) {
  std::vector<std::byte> out = test::to_bytes(a);
  out.insert(out.end(), b.begin(), b.end());
  auto tail = test::to_bytes(c);
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

TEST(Sinks, FileSinkWritesSlicesFromTwoThreadsInPlace) {
  test::TempDir dir;
  std::string path = dir.file("sliced.bin");
  // Large enough for the two-thread path, with a short last slice, after an unaligned header.
  const auto block = pattern(9 * kSlice + 12345);
  {
    auto s = create_file_sink(path);
    s->write(std::string_view("head"));
    s->reserve(block.size() + 4);
    Visits v;
    v.block = block;
    s->write_sliced(block, kSlice, v.visitor());
    v.expect_every_slice(4, block.size());
    EXPECT_EQ(s->position(), 4 + block.size());
    s->write(std::string_view("tail"));
    s->patch(0, test::to_bytes("HEAD"));
    s->commit();
  }
  EXPECT_EQ(test::read_file(path), concat("HEAD", block, "tail"));
}

TEST(Sinks, SequentialWriteSlicedByDefault) {
  const auto block = pattern(5 * kSlice + 7);
  MemorySink m;
  m.reserve(1 << 30);  // a hint: no effect on a memory sink
  m.write(std::string_view("head"));
  Visits v;
  v.block = block;
  std::vector<uint64_t> order;
  m.write_sliced(block, kSlice, [&](size_t i, uint64_t off, std::span<const std::byte> s) {
    order.push_back(off);
    v.visitor()(i, off, s);
  });
  v.expect_every_slice(4, block.size());
  EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
  m.write(std::string_view("tail"));
  EXPECT_EQ(m.bytes(), concat("head", block, "tail"));

  // Small blocks take the sequential path in a file sink too; an empty block visits nothing.
  test::TempDir dir;
  std::string path = dir.file("small.bin");
  auto s = create_file_sink(path);
  const auto small = pattern(2 * kSlice + 1);
  Visits w;
  w.block = small;
  s->write_sliced(small, kSlice, w.visitor());
  w.expect_every_slice(0, small.size());
  s->write_sliced({}, kSlice, w.visitor());
  EXPECT_EQ(w.calls, 3u);
  EXPECT_CKPT_ERROR(s->write_sliced(small, 0, w.visitor()), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(m.write_sliced(small, 0, w.visitor()), ErrorCode::kInvalidArgument);
  s->commit();
  EXPECT_EQ(test::read_file(path), small);
}

// Secrets (key files) are the owner's alone from creation on, atomic or not; other files get
// 0666 & ~umask.
TEST(Sinks, OwnerOnlyFilesAreMode0600) {
  test::TempDir dir;
  const mode_t mask = ::umask(022);
  for (bool atomic : {true, false}) {
    FileSinkOptions o;
    o.atomic = atomic;
    o.fsync = false;
    o.owner_only = true;
    std::string secret = dir.file(atomic ? "a.key" : "n.key");
    auto s = create_file_sink(secret, o);
    s->write(std::string_view("k"));
    s->commit();
    struct stat st;
    ASSERT_EQ(::stat(secret.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << atomic;
    o.owner_only = false;
    std::string plain = dir.file(atomic ? "a.bin" : "n.bin");
    auto p = create_file_sink(plain, o);
    p->commit();
    ASSERT_EQ(::stat(plain.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0644u) << atomic;
  }
  ::umask(mask);
}

// replace = false (key files): a file that appears while the sink writes is never overwritten;
// the sink's bytes go, no temporary is left, and the error names the file.
TEST(Sinks, NoReplaceNeverOverwritesAFileThatAppeared) {
  test::TempDir dir;
  auto put = [](const std::string& p, std::string_view s) {
    test::write_file(p, std::as_bytes(std::span(s.data(), s.size())));
  };
  auto get = [](const std::string& p) {
    auto b = test::read_file(p);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  };
  for (bool atomic : {true, false}) {
    std::string key = dir.file(atomic ? "a.key" : "n.key");
    FileSinkOptions o;
    o.atomic = atomic;
    o.fsync = false;
    o.replace = false;
    if (atomic) {
      auto s = create_file_sink(key, o);
      s->write(std::string_view("new"));
      put(key, "theirs");  // another process, meanwhile
      try {
        s->commit();
        ADD_FAILURE() << "commit replaced an existing file";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_EQ(e.source(), key);
      }
    } else {
      put(key, "theirs");
      EXPECT_CKPT_ERROR(create_file_sink(key, o), ErrorCode::kInvalidArgument);
    }
    EXPECT_EQ(get(key), "theirs");
    // Absent: written as usual.
    std::string fresh = dir.file(atomic ? "a2.key" : "n2.key");
    auto s = create_file_sink(fresh, o);
    s->write(std::string_view("k"));
    s->commit();
    EXPECT_EQ(get(fresh), "k");
  }
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST(Sinks, ReserveChangesNoContent) {
  test::TempDir dir;
  std::string path = dir.file("reserved.bin");
  auto s = create_file_sink(path);
  s->write(std::string_view("abc"));
  s->reserve(64 << 20);  // more than is written: the size still follows the writes
  s->write(std::string_view("def"));
  s->commit();
  EXPECT_EQ(test::to_string(test::read_file(path)), "abcdef");
  EXPECT_EQ(std::filesystem::file_size(path), 6u);
}

TEST(Sinks, VisitorExceptionStopsWriteSliced) {
  test::TempDir dir;
  std::string path = dir.file("thrown.bin");
  const auto block = pattern(16 * kSlice);
  {
    auto s = create_file_sink(path);
    EXPECT_THROW(s->write_sliced(block, kSlice,
                                 [](size_t, uint64_t off, std::span<const std::byte>) {
                                   if (off == 5 * kSlice) throw std::runtime_error("visitor");
                                 }),
                 std::runtime_error);
    // The sink is still usable for another block once the failed one has stopped.
    Visits v;
    v.block = block;
    s->write_sliced(block, kSlice, v.visitor());
    v.expect_every_slice(0, block.size());
    // destroyed without commit
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// A write that fails on either thread (here: past RLIMIT_FSIZE, EFBIG) is an Error{kIo} naming
// the file, and the temporary file goes with the sink.
TEST(Sinks, WriteSlicedFailureIsAnIoError) {
  test::TempDir dir;
  std::string path = dir.file("big.bin");
  const auto block = pattern(24 * kSlice);
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // write() returns EFBIG instead of a signal
  struct rlimit small = old;
  small.rlim_cur = 10 * kSlice + 100;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  Error e = test::capture_error([&] {
    auto s = create_file_sink(path);
    s->reserve(block.size());
    s->write_sliced(block, kSlice, [](size_t, uint64_t, std::span<const std::byte>) {});
    s->commit();
  });
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(e.code(), ErrorCode::kIo);
  EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// A writer killed before commit leaves ".<name>.tmp-XXXXXX". The next atomic sink for the same
// target removes such a file once it is a minute old and no live writer holds its lock; a fresh
// one (a writer that just created it) and a locked one (a writer still at work) stay.
TEST(FileSinkTemporaries, StaleOnesAreSweptLiveOnesKept) {
  test::TempDir dir;
  const std::string target = dir.file("m.pt");
  auto make = [&](const std::string& suffix, bool old) {
    std::string p = dir.file(".m.pt.tmp-" + suffix);
    test::write_file(p, test::to_bytes("partial"));
    if (old) {
      timespec t[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
      EXPECT_EQ(::utimensat(AT_FDCWD, p.c_str(), t, 0), 0);
    }
    return p;
  };
  const std::string stale = make("AAAAAA", true), fresh = make("BBBBBB", false),
                    locked = make("CCCCCC", true), other = dir.file(".n.pt.tmp-DDDDDD");
  test::write_file(other, test::to_bytes("x"));
  int fd = ::open(locked.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  {
    auto s = create_file_sink(target, {.atomic = true, .fsync = false});
    s->write(std::string_view("done"));
    s->commit();
  }
  ::close(fd);
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(fresh));
  EXPECT_TRUE(std::filesystem::exists(locked));
  EXPECT_TRUE(std::filesystem::exists(other));  // another target's: not ours to judge
  EXPECT_EQ(test::to_string(test::read_file(target)), "done");
}

// FileSink stages small writes and sends them with later ones; whatever the mix of sizes and
// patches (into staged bytes too), the file holds exactly what a MemorySink holds.
TEST(FileSinkStaging, MixedWritesAndPatchesMatchMemory) {
  test::TempDir dir;
  const std::string path = dir.file("mix.bin");
  MemorySink mem;
  auto file = create_file_sink(path, {.atomic = true, .fsync = false});
  std::vector<std::byte> big(300000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = std::byte(i * 13 + 1);
  uint64_t seed = 7;
  for (int step = 0; step < 400; ++step) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    const size_t n = (seed >> 33) % 5 == 0 ? 70000 + (seed >> 40) % 200000 : (seed >> 40) % 3000;
    auto piece = std::span<const std::byte>(big).subspan((seed >> 20) % 1000, n);
    mem.write(piece);
    file->write(piece);
    if (step % 37 == 0 && mem.position() > 8) {
      const uint64_t at =
          mem.position() - 1 - (seed >> 45) % std::min<uint64_t>(mem.position() - 1, 5000);
      auto patch = test::to_bytes("PATCH");
      const size_t len = std::min<uint64_t>(patch.size(), mem.position() - at);
      mem.patch(at, std::span<const std::byte>(patch).first(len));
      file->patch(at, std::span<const std::byte>(patch).first(len));
    }
    ASSERT_EQ(file->position(), mem.position());
  }
  file->commit();
  auto got = test::read_file(path);
  ASSERT_EQ(got.size(), mem.bytes().size());
  EXPECT_TRUE(got == mem.bytes());
}

// Whether `path` is on a file system whose large fsynced files a file sink writes past the page
// cache (io/direct_stage.h), so that their pages are not resident afterwards.
bool writes_direct(const std::string& path) {
  struct statfs fs;
  if (::statfs(path.c_str(), &fs) != 0) return false;
  return fs.f_type == EXT4_SUPER_MAGIC || fs.f_type == XFS_SUPER_MAGIC ||
         fs.f_type == BTRFS_SUPER_MAGIC;
}

size_t resident_pages(const std::string& path) {
  const size_t size = std::filesystem::file_size(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  std::vector<unsigned char> in((size + 4095) / 4096);
  EXPECT_EQ(::mincore(p, size, in.data()), 0);
  ::munmap(p, size);
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n;
}

// A large file fsynced on commit is written past the page cache from reserve() on, in pieces of
// any size; a patch or write_sliced goes back to the page cache first, and so does the end of the
// reserved size. Whatever the mix, the file holds exactly what a MemorySink holds.
TEST(FileSinkDirect, LargeFsyncedFilesMatchMemory) {
  test::TempDir dir;
  const std::vector<std::byte> big = pattern(9 << 20);
  for (int leave : {0, 1, 2}) {  // at the reserved end, by a patch, by write_sliced
    const std::string path = dir.file("direct" + std::to_string(leave) + ".bin");
    MemorySink mem;
    auto file = create_file_sink(path);
    const uint64_t reserved = (64 << 20) + 12345;
    file->reserve(reserved);
    uint64_t seed = 11;
    while (mem.position() < reserved + 5000) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      const size_t n =
          std::min<uint64_t>((seed >> 33) % 3 == 0 ? (seed >> 40) % 5000 : (seed >> 40) % (9 << 20),
                             reserved + 5000 - mem.position());
      auto piece = std::span<const std::byte>(big).subspan(0, n);
      mem.write(piece);
      if (leave == 2 && mem.position() > (20 << 20) && mem.position() < (40 << 20)) {
        file->write_sliced(piece, kSlice, [](size_t, uint64_t, std::span<const std::byte>) {});
      } else {
        file->write(piece);
      }
      if (leave == 1 && mem.position() > (30 << 20) && mem.position() < (50 << 20)) {
        const auto patch = test::to_bytes("PATCH");
        mem.patch(4097, patch);
        file->patch(4097, patch);
      }
      ASSERT_EQ(file->position(), mem.position());
    }
    file->commit();
    auto got = test::read_file(path);
    ASSERT_EQ(got.size(), mem.bytes().size()) << leave;
    EXPECT_TRUE(got == mem.bytes()) << leave;
  }
  const std::string path = dir.file("unread.bin");
  auto file = create_file_sink(path);
  for (int round = 0; round < 2; ++round) {  // a second reserved region once the first is written
    file->reserve(big.size() * 8);
    for (int i = 0; i < 8; ++i) file->write(big);
  }
  file->commit();
  ASSERT_EQ(std::filesystem::file_size(path), big.size() * 16);
  if (writes_direct(path)) EXPECT_LT(resident_pages(path), 128u) << "written through the cache";
}

}  // namespace
}  // namespace ckpt
