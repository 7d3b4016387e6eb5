// ckpt bench FILE [--json] [--repeat N] [--threads N] [--device cuda:N]: times open, mmap load,
// eager load (with and without verification), streaming, save, and convert to pt (ckpt::convert,
// against save_torch of the same tensors loaded) of FILE, each beside its own limit: the same work
// done by plain system calls with the same thread count into the same kind of memory (eager: T
// threads pread into fresh huge pages; streaming: one thread pread into a warm ring; mmap: touching
// a fresh mapping; save/convert: two threads pwrite to a new file), so no ratio exceeds 1 unless
// ckpt really does better than the plain calls. Medians; GB/s = 1e9 bytes per second.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "ckpt/convert.h"
#include "ckpt/remote.h"
#include "common.h"
#include "progress.h"

namespace ckpt::cli {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One untimed run first (it pays one-time costs such as huge-page compaction), then the median
// of `repeat` timed runs; `setup` runs untimed before each.
double time_it(int repeat, const std::function<void()>& fn,
               const std::function<void()>& setup = {}) {
  if (setup) setup();
  fn();
  std::vector<double> t;
  for (int i = 0; i < repeat; ++i) {
    if (setup) setup();
    double t0 = now_seconds();
    fn();
    t.push_back(now_seconds() - t0);
  }
  return median(t);
}

// memcpy of `n` bytes into freshly mapped memory (first-touch faults included).
double fresh_memcpy(const std::byte* src, size_t n, bool huge, int repeat) {
  return time_it(repeat, [&] {
    size_t len = n + (2 << 20);
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error(ErrorCode::kIo, "mmap failed");
    auto base = (reinterpret_cast<uintptr_t>(p) + (2 << 20) - 1) & ~uintptr_t((2 << 20) - 1);
    ::madvise(reinterpret_cast<void*>(base), n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    std::memcpy(reinterpret_cast<void*>(base), src, n);
    ::munmap(p, len);
  });
}

// Fresh anonymous memory of `n` bytes, 2 MiB-aligned, with or without huge pages; unmapped by the
// deleter. Not touched here.
std::shared_ptr<std::byte> fresh_memory(size_t n, bool huge) {
  const size_t len = n + (2 << 20);
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw Error(ErrorCode::kIo, "mmap failed");
  auto base = (reinterpret_cast<uintptr_t>(p) + (2 << 20) - 1) & ~uintptr_t((2 << 20) - 1);
  ::madvise(reinterpret_cast<void*>(base), n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return std::shared_ptr<std::byte>(reinterpret_cast<std::byte*>(base),
                                    [p, len](std::byte*) { ::munmap(p, len); });
}

// `threads` threads taking `size`-byte pieces of [0, n) in turn and running `piece(offset, len)`:
// 8 MiB as the eager loader hands out work, 1 MiB as the file sink's two writers take slices.
void in_pieces(uint64_t n, int threads, const std::function<void(uint64_t, uint64_t)>& piece,
               uint64_t kPiece = 8 << 20) {
  std::atomic<uint64_t> next{0};
  auto work = [&] {
    for (uint64_t off; (off = next.fetch_add(kPiece)) < n;) piece(off, std::min(kPiece, n - off));
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

// Reads in 1 MiB calls, the eager loader's size.
void pread_all(int fd, std::byte* dst, uint64_t off, uint64_t len) {
  while (len) {
    ssize_t k = ::pread(fd, dst, std::min<uint64_t>(len, 1 << 20), static_cast<off_t>(off));
    if (k <= 0) throw Error(ErrorCode::kIo, "pread failed");
    dst += k, off += static_cast<uint64_t>(k), len -= static_cast<uint64_t>(k);
  }
}

void pwrite_all(int fd, const std::byte* src, uint64_t off, uint64_t len) {
  while (len) {
    ssize_t k = ::pwrite(fd, src, len, static_cast<off_t>(off));
    if (k <= 0) throw Error(ErrorCode::kIo, "pwrite failed (disk full?)");
    src += k, off += static_cast<uint64_t>(k), len -= static_cast<uint64_t>(k);
  }
}

// `ckpt load FILE --json ARGS` in a fresh process (this executable): its JSON report, or an
// empty object when it fails. The first load of a process: nothing warm but the page cache.
nlohmann::json fresh_load(const std::string& file, const std::string& args) {
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return nlohmann::json::object();
  exe[n] = 0;
  std::string cmdline = std::string("'") + exe + "' load '" + file + "' --json " + args;
  FILE* p = ::popen(cmdline.c_str(), "r");
  if (!p) return nlohmann::json::object();
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  ::pclose(p);
  try {
    return nlohmann::json::parse(out);
  } catch (...) {
    return nlohmann::json::object();
  }
}

// A device bench's timed rows (name, seconds) and what they are set against.
struct TimedRow {
  std::string name;
  double seconds;
};
struct DeviceFacts {
  std::string file, what;
  uint64_t bytes;
  size_t tensors;
  int threads, all, repeat;
  size_t first_dev;  // rows from here on are device loads, set against `goal`
  double goal, best_host, all_host;
  std::string path;  // "staged", "unified" or "gds": how the device rows' bytes went
};

void print_device_rows(const DeviceFacts& f, const std::vector<TimedRow>& rows, bool json) {
  if (json) {
    nlohmann::ordered_json j{{"file", f.file},       {"device", f.what}, {"bytes", f.bytes},
                             {"threads", f.threads}, {"cores", f.all},   {"path", f.path}};
    for (size_t i = 0; i < rows.size(); ++i) {
      nlohmann::ordered_json x{{"name", rows[i].name},
                               {"seconds", rows[i].seconds},
                               {"gb_per_s", f.bytes / rows[i].seconds / 1e9}};
      if (i >= f.first_dev) x["vs_goal"] = f.goal / rows[i].seconds;
      j["results"].push_back(std::move(x));
    }
    j["host_all_cores_vs_best"] = f.best_host / f.all_host;
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  std::printf("%s: %s in %zu tensors into %s, medians of %d runs; path: %s\n", f.file.c_str(),
              human_bytes(f.bytes).c_str(), f.tensors, f.what.c_str(), f.repeat, f.path.c_str());
  int w = 62;
  for (const auto& row : rows) w = std::max(w, static_cast<int>(row.name.size()));
  std::printf("%-*s %10s %9s %8s\n", w, "measurement", "ms", "GB/s", "x goal");
  for (size_t i = 0; i < rows.size(); ++i) {
    std::printf("%-*s %10.2f %9.2f", w, rows[i].name.c_str(), rows[i].seconds * 1e3,
                f.bytes / rows[i].seconds / 1e9);
    if (i >= f.first_dev)
      std::printf(" %8.2f\n", f.goal / rows[i].seconds);
    else
      std::printf(" %8s\n", "-");
  }
  std::printf(
      "goal: min(link, ckpt eager load at all %d cores) = %.2f GB/s; host load at all "
      "cores vs the best thread count: %.2fx\n",
      f.all, f.bytes / f.goal / 1e9, f.best_host / f.all_host);
}

// `ckpt bench FILE --device cuda:N`: loads into the device beside the limits that bound them,
// in one run: the link (one pinned host-to-device copy), the page-cache read limit at the same
// threads and at all cores (pread into warm memory), and ckpt's own eager load into host memory
// at several thread counts (a device load cannot beat reading the bytes). The goal a device row
// is set against: min(link, ckpt's host eager load at all cores).
void bench_device(const std::string& file, const Device& device, int r, int threads, bool json) {
  const std::string dev = device.str();
  const std::string what = describe_device(device);  // kUnsupported where there is none
  Checkpoint warm = Checkpoint::open(file);
  uint64_t bytes = 0;
  for (const auto& s : warm.storages()) bytes += s.nbytes;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kIo, "cannot open", file);
  const uint64_t fsize = static_cast<uint64_t>(::lseek(fd, 0, SEEK_END));
  const int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<TimedRow> rows;
  auto tstr = [](int t) { return std::to_string(t) + (t == 1 ? " thread" : " threads"); };
  rows.push_back({"link: pinned host->" + dev + " copy", time_pinned_copy(device, bytes, r)});
  {
    auto dst = fresh_memory(fsize, true);
    std::memset(dst.get(), 0, fsize);
    for (int t : {threads, all}) {
      rows.push_back({"limit: pread into warm memory, " + tstr(t), time_it(r, [&] {
                        in_pieces(fsize, t, [&](uint64_t off, uint64_t len) {
                          pread_all(fd, dst.get() + off, off, len);
                        });
                      })});
      if (t == all) break;
    }
  }
  ::close(fd);
  std::vector<int> counts;
  for (int t : {4, 8, 16, 32, 64})
    if (t < all) counts.push_back(t);
  counts.push_back(all);
  double best_host = 1e30, all_host = 0;
  for (int t : counts) {
    LoadOptions lo;
    lo.threads = t;
    double s = time_it(
        r, [&] { LoadedCheckpoint l = Checkpoint::open_and_load(file, {}, lo); },
        [] { release_kept_memory(); });
    rows.push_back({"ckpt: eager load into host memory, " + tstr(t), s});
    best_host = std::min(best_host, s);
    if (t == all) all_host = s;
  }
  const double link = rows[0].seconds;
  const size_t first_dev = rows.size();
  // The first load of a fresh process (its context made before the timing starts).
  if (double s = fresh_load(file, "--device " + dev + " --threads " + std::to_string(threads))
                     .value("seconds", 0.0);
      s > 0)
    rows.push_back({"ckpt: first load into " + dev + " in a fresh process, " + tstr(threads), s});
  const uint64_t unified_before = unified_bytes_loaded(), gds_before = gds_bytes_read();
  for (uint64_t staging_mb : {64, 256})
    for (bool verify : {false, true}) {
      if (staging_mb != 64 && verify) continue;
      LoadOptions lo;
      lo.threads = threads;
      lo.device = device;
      lo.verify = verify;
      lo.staging_bytes = staging_mb << 20;
      double s = time_it(r, [&] { LoadedCheckpoint l = Checkpoint::open_and_load(file, {}, lo); });
      rows.push_back({"ckpt: load into " + dev + ", " + tstr(threads) + ", " +
                          std::to_string(staging_mb) + " MiB staging" + (verify ? " + verify" : ""),
                      s});
    }
  const double goal = std::max(link, all_host);  // the slower of the two bounds
  const std::string path = gds_bytes_read() > gds_before             ? "gds"
                           : unified_bytes_loaded() > unified_before ? "unified"
                                                                     : "staged";
  print_device_rows({file, what, bytes, warm.tensors().size(), threads, all, r, first_dev, goal,
                     best_host, all_host, path},
                    rows, json);
}

struct BenchOptions {
  std::string file;
  bool json = false;
  int repeat = 5;
  int threads = 0;
  std::string device = "cpu";
  ProgressMode progress = ProgressMode::kAuto;
};

// One timed row of the host bench.
struct Row {
  std::string name;
  double seconds;
  uint64_t bytes;
  int limit;  // index of the row that bounds this one (-1: none)
};
// Peak memory of a load in a fresh process, and what it should stay under.
struct Rss {
  std::string name;
  uint64_t bytes, target;
};
// The rows of the limits each ckpt row is set against.
struct LimitRows {
  int eager, warm, stream, mmap, write;
};

// The state of a host bench: the file (its page cache warmed, its bytes mapped), the rows so far.
struct HostBench {
  const BenchOptions& o;
  int r;
  int threads;
  Checkpoint warm;
  uint64_t bytes = 0;  // the storages' bytes
  SourcePtr src;
  uint64_t fsize = 0;
  uint64_t budget = 0;  // of the streaming rows
  std::vector<Row> rows;
  // The progress line names the measurement running (a bench takes a while on a large file).
  ProgressLine line;
  static constexpr size_t kRows = 15;

  HostBench(const BenchOptions& opts, int repeat, int nthreads)
      : o(opts),
        r(repeat),
        threads(nthreads),
        warm(Checkpoint::open(opts.file)),
        line(opts.progress, "bench") {
    // Warm the page cache and get the size.
    for (const auto& s : warm.storages()) bytes += s.nbytes;
    src = open_mmap_source(o.file);
    fsize = src->size();
    {
      volatile uint64_t sink = 0;
      for (uint64_t off = 0; off < fsize; off += 4096)
        sink += std::to_integer<uint8_t>(src->memory()[off]);
    }
    line.count_items("measurements");
    // 64 MiB, or the largest storage when one is bigger (a storage is handed over whole).
    budget = 64ull << 20;
    for (const auto& st : warm.storages())
      budget = std::max(budget, (st.nbytes + 63) & ~uint64_t(63));
  }
  int add(const std::string& n, double s, uint64_t b, int limit = -1) {
    rows.push_back({n, s, b, limit});
    line.update(rows.size(), kRows);
    return static_cast<int>(rows.size() - 1);
  }
  static std::string tstr(int t) { return std::to_string(t) + (t == 1 ? " thread" : " threads"); }
};

// Machine facts (no ratio): memcpy into fresh pages of either kind. Returns the file's bytes
// copied into ordinary memory.
std::vector<std::byte> measure_machine(HostBench& b) {
  const int r = b.r;
  const uint64_t fsize = b.fsize;
  std::vector<std::byte> warm_buf(fsize);
  std::memcpy(warm_buf.data(), b.src->memory(), fsize);
  b.add("machine: memcpy into fresh 4 KiB pages", fresh_memcpy(warm_buf.data(), fsize, false, r),
        fsize);
  b.add("machine: memcpy into fresh huge pages", fresh_memcpy(warm_buf.data(), fsize, true, r),
        fsize);
  return warm_buf;
}

// The limits of the loads: the file read by plain system calls from `fd` into the memory each
// load fills, with the same threads.
void measure_read_limits(HostBench& b, int fd, LimitRows& lim) {
  const int r = b.r, threads = b.threads;
  const uint64_t fsize = b.fsize, budget = b.budget;
  lim.eager = b.add("limit: pread into fresh huge pages, " + b.tstr(threads),
                    time_it(r,
                            [&] {
                              auto dst = fresh_memory(fsize, true);
                              in_pieces(fsize, threads, [&](uint64_t off, uint64_t len) {
                                pread_all(fd, dst.get() + off, off, len);
                              });
                            }),
                    fsize);
  // The same into memory a previous run already faulted in: the limit of an eager load that
  // reuses the arena the last load freed (ckpt/memory.h).
  lim.warm = b.add(
      "limit: pread into warm huge pages, " + b.tstr(threads),
      [&] {
        auto dst = fresh_memory(fsize, true);
        std::memset(dst.get(), 0, fsize);
        return time_it(r, [&] {
          in_pieces(fsize, threads,
                    [&](uint64_t off, uint64_t len) { pread_all(fd, dst.get() + off, off, len); });
        });
      }(),
      fsize);
  lim.stream = b.add(
      "limit: pread into a warm " + human_bytes(budget) + " ring, " + b.tstr(threads),
      [&] {
        auto ring = fresh_memory(budget, true);
        std::memset(ring.get(), 0, budget);
        // 4 MiB pieces of the file, each to its place modulo the ring (a piece never wraps).
        constexpr uint64_t kPiece = 4 << 20;
        const uint64_t slots = std::max<uint64_t>(1, budget / kPiece);
        return time_it(r, [&] {
          in_pieces(
              fsize, threads,
              [&](uint64_t off, uint64_t len) {
                pread_all(fd, ring.get() + (off / kPiece % slots) * kPiece, off,
                          std::min(len, budget));
              },
              kPiece);
        });
      }(),
      fsize);
  lim.mmap = b.add("limit: touch a fresh mapping of the file, 1 thread",
                   time_it(r,
                           [&] {
                             void* p = ::mmap(nullptr, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
                             if (p == MAP_FAILED)
                               throw Error(ErrorCode::kIo, "mmap failed", b.o.file);
                             volatile uint64_t sink = 0;
                             const auto* m = static_cast<const std::byte*>(p);
                             for (uint64_t off = 0; off < fsize; off += 4096)
                               sink += std::to_integer<uint8_t>(m[off]);
                             ::munmap(p, fsize);
                           }),
                   fsize);
}

// The limit of the saves: the file's bytes written by plain system calls.
int measure_write_limit(HostBench& b, const std::vector<std::byte>& warm_buf) {
  const int r = b.r;
  const uint64_t fsize = b.fsize;
  // Saves write loaded tensors (a warm huge-page arena) in 1 MiB slices from two threads into
  // a preallocated file: the limit writes the same way from the same kind of memory — with two
  // threads and with one, keeping the faster: ext4 serializes buffered writes to one file on
  // its inode lock, so two plain writers contend (slower than one here) while ckpt's two
  // overlap one's checksum with the other's write. The better plain way is the bound.
  const std::string scratch = b.o.file + ".bench-limit";
  auto warm_huge = fresh_memory(fsize, true);
  std::memcpy(warm_huge.get(), warm_buf.data(), fsize);
  auto write_limit = [&](int writers) {
    return time_it(
        r,
        [&] {
          int wfd = ::open(scratch.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
          if (wfd < 0) throw Error(ErrorCode::kIo, "cannot create", scratch);
          (void)::fallocate(wfd, FALLOC_FL_KEEP_SIZE, 0,
                            static_cast<off_t>(fsize));  // as the sink reserves
          in_pieces(
              fsize, writers,
              [&](uint64_t off, uint64_t len) { pwrite_all(wfd, warm_huge.get() + off, off, len); },
              1 << 20);
          ::close(wfd);
        },
        [&] {
          std::remove(scratch.c_str());
          ::sync();
        });
  };
  const int row = b.add("limit: pwrite to a new file (page cache), best of 1 and 2 threads",
                        std::min(write_limit(2), write_limit(1)), fsize);
  warm_huge.reset();
  std::remove(scratch.c_str());
  return row;
}

// Machine facts (no ratio), then the limits: the work of a ckpt row done by plain system calls,
// same threads, same memory.
LimitRows measure_limits(HostBench& b) {
  const std::vector<std::byte> warm_buf = measure_machine(b);
  const int fd = ::open(b.o.file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kIo, "cannot open", b.o.file);
  LimitRows lim;
  try {
    measure_read_limits(b, fd, lim);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  lim.write = measure_write_limit(b, warm_buf);
  return lim;
}

// ckpt's rows: open, mmap load, eager loads, streaming load.
void measure_loads(HostBench& b, const LimitRows& lim) {
  const int r = b.r, threads = b.threads;
  const std::string& file = b.o.file;
  const uint64_t bytes = b.bytes, budget = b.budget;
  b.add("ckpt: open + list",
        time_it(r,
                [&] {
                  Checkpoint c = Checkpoint::open(file);
                  volatile size_t n = c.tensors().size();
                  (void)n;
                }),
        0);
  b.add("ckpt: mmap load (views, pages touched), 1 thread",
        time_it(r,
                [&] {
                  Checkpoint c = Checkpoint::open(file);
                  volatile uint64_t sink = 0;
                  for (size_t i = 0; i < c.tensors().size(); ++i) {
                    Tensor t = c.tensor(i);
                    const std::byte* p = t.storage()->data;
                    for (uint64_t off = 0; off < t.storage()->info.nbytes; off += 4096)
                      sink += std::to_integer<uint8_t>(p[off]);
                  }
                }),
        bytes, lim.mmap);
  // Eager: open_and_load (reads overlap the metadata parse); the sequential form beside it.
  // Eager rows load into fresh memory, as their limit does: the arena a load keeps for the
  // next one (ckpt/memory.h) is released before each run; one row shows what keeping gives.
  auto no_kept = [] { release_kept_memory(); };
  LoadOptions host_lo;
  host_lo.threads = threads;
  b.add("ckpt: eager load, " + b.tstr(threads),
        time_it(
            r, [&] { LoadedCheckpoint l = Checkpoint::open_and_load(file, {}, host_lo); }, no_kept),
        bytes, lim.eager);
  b.add("ckpt: eager load + verify CRC32, " + b.tstr(threads),
        time_it(
            r,
            [&] {
              LoadOptions lo = host_lo;
              lo.verify = true;
              LoadedCheckpoint l = Checkpoint::open_and_load(file, {}, lo);
            },
            no_kept),
        bytes, lim.eager);
  b.add("ckpt: eager, open then load_all, " + b.tstr(threads),
        time_it(
            r,
            [&] {
              Checkpoint c = Checkpoint::open(file);
              auto t = c.load_all(host_lo);
            },
            no_kept),
        bytes, lim.eager);
  b.add("ckpt: eager load again (memory kept from the last load), " + b.tstr(threads),
        time_it(r, [&] { LoadedCheckpoint l = Checkpoint::open_and_load(file, {}, host_lo); }),
        bytes, lim.warm);
  std::string budget_name =
      "ckpt: streaming load, " + human_bytes(budget) + " budget, " + b.tstr(threads);
  b.add(budget_name,
        time_it(r,
                [&] {
                  Checkpoint c = Checkpoint::open(file);
                  volatile uint64_t sink = 0;
                  c.stream(
                      budget,
                      [&](const Tensor& t) {
                        const std::byte* p = t.data();
                        for (uint64_t off = 0; off < t.info().nbytes(); off += 4096)
                          sink += std::to_integer<uint8_t>(p[off]);
                      },
                      host_lo);
                }),
        bytes, lim.stream);
}

// Save what an eager load produced, to the page cache and then to disk (fsync), and convert to
// pt: returns the time of convert over the time of save.
double measure_save_convert(HostBench& b, int lim_write) {
  const int r = b.r;
  const std::string& file = b.o.file;
  double save_seconds = 0, convert_seconds = 0;
  Checkpoint c = Checkpoint::open(file);
  auto tensors = c.load_all();
  std::string out = file + ".bench-save.pt";
  // Flat formats (safetensors, tensorizer) are saved as the state dict torch would write.
  bool torch_tree = format_traits(c.format()).tree_values;
  auto state_dict = state_dict_value(tensors);
  for (bool fsync : {false, true}) {
    SaveOptions so;
    so.fsync = fsync;
    // Every save starts from a clean page cache (sync untimed): otherwise earlier writes
    // still waiting for the disk throttle this one (vm.dirty_ratio) and the figure measures
    // the disk's backlog.
    double s = time_it(
        r,
        [&] {
          if (torch_tree)
            save_torch(out, c.root(), tensors, so);
          else
            save_torch(out, state_dict, tensors, so);
        },
        [&] {
          std::remove(out.c_str());
          ::sync();
        });
    b.add(fsync ? "ckpt: save (+ fsync)" : "ckpt: save (page cache), 2 threads", s, b.bytes,
          fsync ? -1 : lim_write);
    if (!fsync) save_seconds = s;
  }
  // ckpt::convert to pt from a freshly opened (mapped) checkpoint: the same save, written
  // from views of the mapping instead of loaded tensors (its page faults included).
  std::optional<Checkpoint> fresh;
  ConvertOptions co;
  co.target = TorchSaveOptions{};
  co.fsync = false;
  convert_seconds = time_it(
      r, [&] { convert(*fresh, out, co); },
      [&] {
        std::remove(out.c_str());
        ::sync();
        fresh.emplace(Checkpoint::open(file));
      });
  b.add("ckpt: convert to pt (page cache), 2 threads", convert_seconds, b.bytes, lim_write);
  std::remove(out.c_str());
  return convert_seconds / save_seconds;
}

// Peak memory of a load, measured in a fresh process (`ckpt load` reports its own peak RSS).
std::vector<Rss> measure_peak_rss(const HostBench& b, double* first_load) {
  auto peak = [&](const std::string& args) -> uint64_t {
    nlohmann::json j = fresh_load(b.o.file, args);
    if (first_load && j.contains("seconds")) *first_load = j["seconds"].get<double>();
    first_load = nullptr;  // the first (eager) run only
    return j.value("peak_rss_bytes", uint64_t{0});
  };
  std::vector<Rss> rss;
  rss.push_back({"peak RSS: eager load", peak("--mode eager"), b.fsize + (64ull << 20)});
  rss.push_back({"peak RSS: streaming load, " + human_bytes(b.budget) + " budget",
                 peak("--mode stream --budget-mb " + std::to_string(b.budget / 1048576.0)),
                 b.budget + (32ull << 20)});
  return rss;
}

double rate(const Row& row) { return row.bytes / row.seconds; }
double vs_limit(const std::vector<Row>& rows, const Row& row) {
  return row.limit >= 0 && row.bytes ? rate(row) / rate(rows[row.limit]) : 0.0;
}

void print_host_json(const HostBench& b, double convert_ratio, const std::vector<Rss>& rss,
                     double first_load) {
  nlohmann::ordered_json j;
  j["file"] = b.o.file;
  j["file_bytes"] = b.fsize;
  j["tensors"] = b.warm.tensors().size();
  j["threads"] = b.threads;
  for (auto& row : b.rows) {
    nlohmann::ordered_json x{{"name", row.name},
                             {"seconds", row.seconds},
                             {"gb_per_s", row.bytes ? rate(row) / 1e9 : 0.0}};
    if (row.limit >= 0) {
      x["limit"] = b.rows[row.limit].name;
      x["vs_limit"] = vs_limit(b.rows, row);
    }
    j["results"].push_back(std::move(x));
  }
  if (first_load > 0)
    j["first_load"] = {{"name", "ckpt: first eager load in a fresh process"},
                       {"seconds", first_load},
                       {"gb_per_s", b.bytes / first_load / 1e9}};
  j["convert_vs_save"] = convert_ratio;
  for (auto& m : rss)
    j["memory"].push_back(
        {{"name", m.name}, {"peak_rss_bytes", m.bytes}, {"target_bytes", m.target}});
  std::printf("%s\n", j.dump(1).c_str());
}

void print_host_text(const HostBench& b, double convert_ratio, const std::vector<Rss>& rss,
                     double first_load) {
  std::printf(
      "%s: %s in %zu tensors, medians of %d runs; each ckpt row beside its limit "
      "(same work by plain system calls, same threads and memory)\n",
      b.o.file.c_str(), human_bytes(b.bytes).c_str(), b.warm.tensors().size(), b.r);
  // The name column fits the longest name (a long one no longer pushes its row's figures
  // out of their columns).
  int w = 58;
  for (auto& row : b.rows) w = std::max(w, static_cast<int>(row.name.size()));
  for (auto& m : rss) w = std::max(w, static_cast<int>(m.name.size()));
  std::printf("%-*s %10s %9s %8s\n", w, "measurement", "ms", "GB/s", "x limit");
  for (auto& row : b.rows) {
    if (!row.bytes) {
      std::printf("%-*s %10.3f %9s %8s\n", w, row.name.c_str(), row.seconds * 1e3, "-", "-");
    } else if (row.limit >= 0) {
      std::printf("%-*s %10.2f %9.2f %8.2f\n", w, row.name.c_str(), row.seconds * 1e3,
                  rate(row) / 1e9, vs_limit(b.rows, row));
    } else {
      std::printf("%-*s %10.2f %9.2f %8s\n", w, row.name.c_str(), row.seconds * 1e3,
                  rate(row) / 1e9, "-");
    }
  }
  if (first_load > 0)
    std::printf("%-*s %10.2f %9.2f %8s  (page cache as the rows above left it)\n", w,
                "ckpt: first eager load in a fresh process", first_load * 1e3,
                b.bytes / first_load / 1e9, "-");
  std::printf(
      "%-*s %10.2fx  (time of convert to pt / time to save the loaded tensors; 1.00: "
      "converting costs nothing over saving)\n",
      w, "convert vs save", convert_ratio);
  for (auto& m : rss)
    std::printf("%-*s %10s   (expected at most %s)\n", w, m.name.c_str(),
                human_bytes(m.bytes).c_str(), human_bytes(m.target).c_str());
}

void run_bench(const BenchOptions& o) {
  if (is_url(o.file)) {
    // Its rows are set beside this machine's own limits (page cache, memory): a local file's.
    std::fprintf(stderr,
                 "ckpt: bench measures a local file against this machine's limits; for a URL, "
                 "`ckpt load URL` prints the load's time and rate (bench/remote.py compares it "
                 "with curl)\n");
    throw ExitStatus{kUsageExit};
  }
  int r = std::max(1, o.repeat);
  const int threads = o.threads > 0
                          ? o.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (Device device = Device::parse(o.device); !device.is_cpu())
    return bench_device(o.file, device, r, threads, o.json);
  HostBench b(o, r, threads);
  const LimitRows lim = measure_limits(b);
  measure_loads(b, lim);
  const double convert_ratio = measure_save_convert(b, lim.write);
  double first_load = 0;
  const std::vector<Rss> rss = measure_peak_rss(b, &first_load);
  b.line.finish(HostBench::kRows);
  if (o.json) return print_host_json(b, convert_ratio, rss, first_load);
  print_host_text(b, convert_ratio, rss, first_load);
}

}  // namespace

void add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "time open and load paths against the machine's limits");
  cmd->add_option("FILE", o->file, "checkpoint")->required();
  cmd->add_flag("--json", o->json, "machine-readable output");
  cmd->add_option("--repeat", o->repeat, "runs per measurement (median)")->check(at_least(1));
  cmd->add_option("--threads", o->threads, "reader threads (default: every core)")
      ->check(at_least(0));
  cmd->add_option("--device", o->device,
                  "cuda or cuda:N: time loads into that device beside the link and the page "
                  "cache's limit, instead of the host rows");
  add_progress_flags(*cmd, o->progress);
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace ckpt::cli
