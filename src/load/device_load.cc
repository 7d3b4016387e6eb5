// The device executor (load/device_load.h).

#include "load/device_load.h"

#include <atomic>
#include <charconv>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "io/local_file.h"
#include "util/arena.h"
#include "util/bytes.h"

namespace ckpt::internal {

std::vector<StoragePtr> execute_device(const LoadPlan& plan, const Device& device,
                                       const LoadOptions& options, DeviceLoadStats* stats) {
  if (engine_ready(device) || !plan.copy || !is_local_file(*plan.copy))
    return execute_device(plan, engine_for(device), options, stats);
  // drop_cache: the residency before the warmers below read anything.
  std::unique_ptr<PageCacheDropper> dropper;
  if (plan.drop_cache) dropper = PageCacheDropper::make(*plan.copy);
  // Raw ranges in the order the load takes them.
  const CheckpointModel& m = *plan.model;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const PlannedStorage& p : plan.storages) {
    const StorageInfo& si = m.storages[p.storage];
    if ((p.route == Route::kRead || p.route == Route::kView) && si.nbytes)
      ranges.emplace_back(si.offset, si.nbytes);
  }
  constexpr uint64_t kPiece = 4 << 20;
  std::atomic<size_t> next_range{0};
  std::atomic<uint64_t> next_off{0}, warmed{0};
  std::atomic<bool> ready{false};
  std::mutex mu;  // hands out the next piece: (range, offset)
  auto warm = [&] {
    std::unique_ptr<std::byte[]> scratch(new std::byte[kPiece]);
    try {
      while (!ready.load(std::memory_order_relaxed)) {
        uint64_t at, len;
        {
          std::lock_guard<std::mutex> lock(mu);
          size_t r = next_range.load();
          if (r >= ranges.size()) return;
          at = ranges[r].first + next_off;
          len = std::min(kPiece, ranges[r].second - next_off);
          if ((next_off += len) >= ranges[r].second) next_off = 0, next_range = r + 1;
        }
        plan.copy->read_into(at, std::span<std::byte>(scratch.get(), len));
        warmed += len;
      }
    } catch (...) {
      // The load proper reads the range again and reports what fails there.
    }
  };
  std::vector<std::thread> pool;
  try {
    for (int r = 0; r < std::max(1, plan.threads); ++r) pool.emplace_back(warm);
  } catch (...) {
    // Fewer warmers (or none): only the overlap is lost.
  }
  struct Join {
    std::atomic<bool>& ready;
    std::vector<std::thread>& pool;
    ~Join() {
      ready = true;
      for (auto& t : pool) t.join();
    }
  };
  CopyEngine* engine;
  {
    Join join{ready, pool};
    engine = &engine_for(device);  // throws (kUnsupported...) after the warmers stop
  }
  std::vector<StoragePtr> out = execute_device(plan, *engine, options, stats, dropper.get());
  if (stats) stats->warmed_bytes = warmed.load();
  return out;
}

namespace {

// A cgroup v2 control file's number ("max" or absent: none).
std::optional<uint64_t> cgroup_value(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::string sizes(uint64_t need, uint64_t room) {
  return std::to_string(need) + " bytes needed, " + std::to_string(room) + " free";
}

}  // namespace

uint64_t host_staging_budget(uint64_t asked) {
  static const std::optional<uint64_t> limit = cgroup_value("/sys/fs/cgroup/memory.max");
  if (!limit) return asked;
  // Pinned memory cannot be reclaimed: at most half of what the cgroup has left now.
  const uint64_t used = cgroup_value("/sys/fs/cgroup/memory.current").value_or(0);
  const uint64_t room = *limit > used ? *limit - used : 0;
  return std::max<uint64_t>(std::min(asked, room / 2), 2 << 20);
}

void check_device_budget(CopyEngine& engine, uint64_t need, const LoadOptions& options,
                         const std::string& file) {
  const std::string dev = engine.device().str();
  if (options.max_device_bytes && need > options.max_device_bytes)
    throw Error(ErrorCode::kLimitExceeded,
                "the load does not fit LoadOptions::max_device_bytes on " + dev + ": " +
                    std::to_string(need) + " bytes needed, " +
                    std::to_string(options.max_device_bytes) + " allowed",
                file);
  const uint64_t free_b = engine.free_bytes();
  if (need > free_b)
    throw Error(ErrorCode::kLimitExceeded,
                "the load does not fit the free memory of " + dev + ": " + sizes(need, free_b),
                file);
}

std::vector<StoragePtr> execute_device(const LoadPlan& plan, CopyEngine& engine,
                                       const LoadOptions& options, DeviceLoadStats* stats,
                                       const PageCacheDropper* dropper) {
  const CheckpointModel& m = *plan.model;
  // Every storage's place and size, then the budget, before any byte moves. Meta storages get
  // no bytes (a null address).
  DeviceMemory memory(plan, options);
  check_device_budget(engine, memory.bytes(), options, m.source->name());
  if (stats) {
    *stats = {};
    stats->device_bytes = memory.bytes();
  }
  // The memory is made on this thread while the readers start (fill_device's `make`).
  fill_device(plan, engine, memory.targets(), options, stats, dropper,
              [&](TargetFeed& feed) { memory.allocate(engine, feed); });

  std::vector<StoragePtr> storages(m.storages.size());
  for (size_t k = 0; k < plan.storages.size(); ++k) {
    const PlannedStorage& p = plan.storages[k];
    StoragePtr st =
        make_storage(m.storages[p.storage], memory.targets()[k].dst, memory.owner(k), false);
    st->device = engine.device();
    storages[p.storage] = std::move(st);
  }
  return storages;
}

}  // namespace ckpt::internal
