// ckpt bench FILE [--json] [--repeat N]: times open, mmap load, eager load (with and without
// verification), save, and convert to pt (ckpt::convert, against save_torch of the same tensors
// loaded) of FILE beside this machine's limits (memcpy into fresh 4 KiB and huge pages,
// page-cache read), in one run. Medians; GB/s = 1e9 bytes per second.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>

#include "ckpt/convert.h"

#include "common.h"

namespace ckpt::cli {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One untimed run first (it pays one-time costs such as huge-page compaction), then the median
// of `repeat` timed runs; `setup` runs untimed before each.
double time_it(int repeat, const std::function<void()>& fn, const std::function<void()>& setup = {}) {
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

}  // namespace

void add_bench(CLI::App& app) {
  struct Opts {
    std::string file;
    bool json = false;
    int repeat = 5;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("bench", "time open and load paths against the machine's limits");
  cmd->add_option("FILE", o->file, "checkpoint")->required();
  cmd->add_flag("--json", o->json, "machine-readable output");
  cmd->add_option("--repeat", o->repeat, "runs per measurement (median)");
  cmd->callback([o] {
    int r = std::max(1, o->repeat);
    // Warm the page cache and get the size.
    Checkpoint warm = Checkpoint::open(o->file);
    uint64_t bytes = 0;
    for (const auto& s : warm.storages()) bytes += s.nbytes;
    auto src = open_mmap_source(o->file);
    uint64_t fsize = src->size();
    {
      volatile uint64_t sink = 0;
      for (uint64_t off = 0; off < fsize; off += 4096) sink += std::to_integer<uint8_t>(src->memory()[off]);
    }
    struct Row {
      std::string name;
      double seconds;
      uint64_t bytes;
    };
    std::vector<Row> rows;
    auto add = [&](const std::string& n, double s, uint64_t b) { rows.push_back({n, s, b}); };

    // Machine limits.
    std::vector<std::byte> warm_buf(fsize);
    std::memcpy(warm_buf.data(), src->memory(), fsize);
    add("limit: memcpy into fresh 4 KiB pages", fresh_memcpy(warm_buf.data(), fsize, false, r), fsize);
    add("limit: memcpy into fresh huge pages", fresh_memcpy(warm_buf.data(), fsize, true, r), fsize);
    auto fsrc = open_file_source(o->file);
    add("limit: page-cache read (pread, warm buffer)", time_it(r, [&] {
          constexpr uint64_t kPiece = 8 << 20;
          for (uint64_t off = 0; off < fsize; off += kPiece)
            fsrc->read_into(off, std::span<std::byte>(warm_buf.data() + off, std::min(kPiece, fsize - off)));
        }), fsize);
    warm_buf = {};

    add("ckpt: open + list", time_it(r, [&] {
          Checkpoint c = Checkpoint::open(o->file);
          volatile size_t n = c.tensors().size();
          (void)n;
        }), 0);
    add("ckpt: mmap load (views, pages touched)", time_it(r, [&] {
          Checkpoint c = Checkpoint::open(o->file);
          volatile uint64_t sink = 0;
          for (size_t i = 0; i < c.tensors().size(); ++i) {
            Tensor t = c.tensor(i);
            const std::byte* p = t.storage()->data;
            for (uint64_t off = 0; off < t.storage()->info.nbytes; off += 4096) sink += std::to_integer<uint8_t>(p[off]);
          }
        }), bytes);
    // Eager: open_and_load (reads overlap the metadata parse); the sequential form beside it.
    add("ckpt: eager load", time_it(r, [&] {
          LoadedCheckpoint l = Checkpoint::open_and_load(o->file);
        }), bytes);
    add("ckpt: eager load + verify CRC32", time_it(r, [&] {
          LoadOptions lo;
          lo.verify = true;
          LoadedCheckpoint l = Checkpoint::open_and_load(o->file, {}, lo);
        }), bytes);
    add("ckpt: eager, open then load_all", time_it(r, [&] {
          Checkpoint c = Checkpoint::open(o->file);
          auto t = c.load_all();
        }), bytes);
    // 64 MiB, or the largest storage when one is bigger (a storage is handed over whole).
    uint64_t budget = 64ull << 20;
    for (const auto& st : warm.storages()) budget = std::max(budget, (st.nbytes + 63) & ~uint64_t(63));
    std::string budget_name = "ckpt: streaming load, " + human_bytes(budget) + " budget";
    add(budget_name, time_it(r, [&] {
          Checkpoint c = Checkpoint::open(o->file);
          volatile uint64_t sink = 0;
          c.stream(budget, [&](const Tensor& t) {
            const std::byte* p = t.data();
            for (uint64_t off = 0; off < t.info().nbytes(); off += 4096) sink += std::to_integer<uint8_t>(p[off]);
          });
        }), bytes);
    double save_seconds = 0, convert_seconds = 0;
    {
      // Save what an eager load produced, to the page cache and then to disk (fsync).
      Checkpoint c = Checkpoint::open(o->file);
      auto tensors = c.load_all();
      std::string out = o->file + ".bench-save.pt";
      // Flat formats (safetensors, tensorizer) are saved as the state dict torch would write.
      bool torch_tree = c.format() == Format::kTorchZip || c.format() == Format::kTorchLegacy;
      auto state_dict = state_dict_value(tensors);
      for (bool fsync : {false, true}) {
        SaveOptions so;
        so.fsync = fsync;
        // Every save starts from a clean page cache (sync untimed): otherwise earlier writes
        // still waiting for the disk throttle this one (vm.dirty_ratio) and the figure measures
        // the disk's backlog.
        double s = time_it(r, [&] {
              if (torch_tree)
                save_torch(out, c.root(), tensors, so);
              else
                save_torch(out, state_dict, tensors, so);
            }, [&] { std::remove(out.c_str()); ::sync(); });
        add(fsync ? "ckpt: save (+ fsync)" : "ckpt: save (page cache)", s, bytes);
        if (!fsync) save_seconds = s;
      }
      // ckpt::convert to pt from a freshly opened (mapped) checkpoint: the same save, written
      // from views of the mapping instead of loaded tensors (its page faults included).
      std::optional<Checkpoint> fresh;
      ConvertOptions co;
      co.to = ConvertFormat::kTorch;
      co.fsync = false;
      convert_seconds = time_it(r, [&] { convert(*fresh, out, co); }, [&] {
        std::remove(out.c_str());
        ::sync();
        fresh.emplace(Checkpoint::open(o->file));
      });
      add("ckpt: convert to pt (page cache)", convert_seconds, bytes);
      std::remove(out.c_str());
    }
    const double convert_ratio = convert_seconds / save_seconds;

    // Peak memory of a load, measured in a fresh process (`ckpt load` reports its own peak RSS).
    struct Rss {
      std::string name;
      uint64_t bytes, target;
    };
    std::vector<Rss> rss;
    auto peak = [&](const std::string& args) -> uint64_t {
      char exe[4096];
      ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
      if (n <= 0) return 0;
      exe[n] = 0;
      std::string cmdline = std::string("'") + exe + "' load '" + o->file + "' --json " + args;
      FILE* p = ::popen(cmdline.c_str(), "r");
      if (!p) return 0;
      std::string out;
      char buf[512];
      while (std::fgets(buf, sizeof buf, p)) out += buf;
      ::pclose(p);
      try {
        return nlohmann::json::parse(out).at("peak_rss_bytes").get<uint64_t>();
      } catch (...) {
        return 0;
      }
    };
    rss.push_back({"peak RSS: eager load", peak("--mode eager"), fsize + (64ull << 20)});
    rss.push_back({"peak RSS: streaming load, " + human_bytes(budget) + " budget",
                   peak("--mode stream --budget-mb " + std::to_string(budget / 1048576.0)),
                   budget + (32ull << 20)});

    double huge_rate = fsize / rows[1].seconds;
    if (o->json) {
      nlohmann::ordered_json j;
      j["file"] = o->file;
      j["file_bytes"] = fsize;
      j["tensors"] = warm.tensors().size();
      for (auto& row : rows)
        j["results"].push_back({{"name", row.name}, {"seconds", row.seconds},
                                {"gb_per_s", row.bytes ? row.bytes / row.seconds / 1e9 : 0.0},
                                {"vs_fresh_huge_memcpy", row.bytes ? (row.bytes / row.seconds) / huge_rate : 0.0}});
      j["convert_vs_save"] = convert_ratio;
      for (auto& m : rss)
        j["memory"].push_back({{"name", m.name}, {"peak_rss_bytes", m.bytes}, {"target_bytes", m.target}});
      std::printf("%s\n", j.dump(1).c_str());
      return;
    }
    std::printf("%s: %s in %zu tensors, medians of %d runs\n", o->file.c_str(),
                human_bytes(bytes).c_str(), warm.tensors().size(), r);
    std::printf("%-46s %10s %9s %12s\n", "measurement", "ms", "GB/s", "x huge-memcpy");
    for (auto& row : rows) {
      if (row.bytes)
        std::printf("%-46s %10.2f %9.2f %12.2f\n", row.name.c_str(), row.seconds * 1e3,
                    row.bytes / row.seconds / 1e9, (row.bytes / row.seconds) / huge_rate);
      else
        std::printf("%-46s %10.3f %9s %12s\n", row.name.c_str(), row.seconds * 1e3, "-", "-");
    }
    std::printf("%-46s %10.2fx  (time of convert to pt / save of loaded tensors; target <= 1.10)\n",
                "convert vs save", convert_ratio);
    for (auto& m : rss)
      std::printf("%-46s %10s   (target <= %s)\n", m.name.c_str(), human_bytes(m.bytes).c_str(),
                  human_bytes(m.target).c_str());
  });
}

}  // namespace ckpt::cli
