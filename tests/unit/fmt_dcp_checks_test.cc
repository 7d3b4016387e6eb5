// The DCP reader's own checks (formats/dcp/dcp_checks.h) and its cache of data files
// (formats/dcp/dcp_files.h): chunks that tile a tensor in tens of thousands of pieces are checked
// in O(n log n), overlaps found in one, two and more split dimensions, and a folder's files read
// with a bounded number open.

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include "formats/dcp/dcp_checks.h"
#include "formats/dcp/dcp_files.h"

namespace ckpt::internal {
namespace {

struct Fault {
  std::string what;
};

void check(DcpEntry& e) {
  check_tiling(e, [](ErrorCode, const std::string& what, const DcpChunk*) { throw Fault{what}; });
}

std::string fault(DcpEntry e) {
  try {
    check(e);
  } catch (const Fault& f) {
    return f.what;
  }
  return "";
}

DcpEntry rows(int64_t n, int64_t cols) {
  DcpEntry e;
  e.fqn = "w";
  e.size = {n, cols};
  for (int64_t r = 0; r < n; ++r) e.chunks.push_back({{r, 0}, {1, cols}});
  std::shuffle(e.chunks.begin(), e.chunks.end(), std::mt19937(1));
  return e;
}

DcpEntry grid(int64_t a, int64_t b) {
  DcpEntry e;
  e.fqn = "w";
  e.size = {a * 2, b * 3};
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) e.chunks.push_back({{i * 2, j * 3}, {2, 3}});
  std::shuffle(e.chunks.begin(), e.chunks.end(), std::mt19937(2));
  return e;
}

double seconds(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(DcpTiling, FiftyThousandRowChunksAreCheckedQuickly) {
  DcpEntry e = rows(50000, 2);
  // Quadratic pair checks took seconds here; the sweep takes milliseconds.
  EXPECT_LT(seconds([&] { check(e); }), 2.0);
  EXPECT_EQ(e.chunks.size(), 50000u);
}

TEST(DcpTiling, FiftyThousandGridChunksAreCheckedQuickly) {
  DcpEntry e = grid(250, 200);
  EXPECT_LT(seconds([&] { check(e); }), 2.0);
}

TEST(DcpTiling, OverlappingRowsAreFound) {
  DcpEntry e = rows(1000, 4);
  e.chunks.push_back({{500, 0}, {2, 4}});
  EXPECT_NE(fault(e).find("overlaps"), std::string::npos);
}

TEST(DcpTiling, OverlapsInAGridAreFound) {
  DcpEntry e = grid(50, 40);
  e.chunks.push_back({{3, 4}, {2, 3}});  // across four cells
  EXPECT_NE(fault(e).find("overlaps"), std::string::npos);
  DcpEntry f = grid(50, 40);
  f.chunks.push_back({{0, 0}, {100, 1}});  // a column through every row
  EXPECT_NE(fault(f).find("overlaps"), std::string::npos);
}

TEST(DcpTiling, OverlapsInThreeSplitDimensionsAreFound) {
  DcpEntry e;
  e.fqn = "w";
  e.size = {4, 4, 4};
  for (int64_t i = 0; i < 4; i += 2)
    for (int64_t j = 0; j < 4; j += 2)
      for (int64_t k = 0; k < 4; k += 2) e.chunks.push_back({{i, j, k}, {2, 2, 2}});
  EXPECT_EQ(fault(e), "");
  e.chunks.push_back({{1, 1, 1}, {1, 1, 1}});
  EXPECT_NE(fault(e).find("overlaps"), std::string::npos);
}

TEST(DcpTiling, HolesDuplicatesAndStrays) {
  DcpEntry e = rows(100, 2);
  e.chunks.push_back(e.chunks[7]);  // the same chunk twice: one storage item, read once
  check(e);
  EXPECT_EQ(e.chunks.size(), 100u);
  DcpEntry hole = rows(100, 2);
  hole.chunks.pop_back();
  EXPECT_NE(fault(hole).find("a hole"), std::string::npos);
  DcpEntry out = rows(10, 2);
  out.chunks.push_back({{9, 0}, {2, 2}});
  EXPECT_NE(fault(out).find("outside"), std::string::npos);
  DcpEntry empty = rows(10, 2);
  empty.chunks.push_back({{3, 0}, {0, 2}});  // an empty chunk overlaps nothing
  EXPECT_EQ(fault(empty), "");
}

TEST(DcpItems, SharedBytesAreFound) {
  std::vector<DcpItemRange> r{{0, 0, 10, 0}, {0, 10, 10, 1}, {1, 0, 10, 2}, {0, 30, 0, 3}};
  EXPECT_FALSE(shared_bytes(r));
  r.push_back({0, 5, 1, 4});  // inside item 0
  auto two = shared_bytes(r);
  ASSERT_TRUE(two);
  EXPECT_EQ(two->first, 0u);
  EXPECT_EQ(two->second, 4u);
  std::vector<DcpItemRange> wide{{0, 0, 100, 0}, {0, 10, 5, 1}, {0, 50, 5, 2}};
  EXPECT_TRUE(shared_bytes(wide));
}

size_t open_fds() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}

TEST(DcpFiles, ManyFilesAreReadWithFewOpen) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ckpt_dcp_files_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto files = data_files(4);
  std::vector<SourcePtr> sources;
  const size_t before = open_fds();
  for (int i = 0; i < 64; ++i) {
    const std::string p = (dir / (std::to_string(i) + ".distcp")).string();
    std::ofstream(p) << "file " << i << ".";
    sources.push_back(open_data_file(files, p, {}));
  }
  EXPECT_LE(open_fds(), before + 4);
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 64; ++i) {
      const std::string want = "file " + std::to_string(i) + ".";
      std::string got(want.size(), '\0');
      sources[i]->read_into(0, std::as_writable_bytes(std::span<char>(got)));
      EXPECT_EQ(got, want);
      EXPECT_EQ(sources[i]->name(), (dir / (std::to_string(i) + ".distcp")).string());
    }
  EXPECT_LE(open_fds(), before + 4);
  // A file that changed since: refused, not misread.
  std::ofstream((dir / "0.distcp").string()) << "longer than it was";
  std::byte b[4];
  EXPECT_THROW(sources[0]->read_into(0, b), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ckpt::internal
