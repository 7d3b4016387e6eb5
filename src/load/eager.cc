// Eager execution of a LoadPlan: raw storages through a Preload (one huge-page arena mirroring
// the file when they are dense, several reader threads doing positional reads straight into
// place, CRC32 fused with the reads); decoded and meta storages by the same threads into the
// arena's extra space (or an arena of their own when the Preload was started before the plan).

#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "load/plan.h"
#include "load/preload.h"
#include "util/arena.h"
#include "util/bytes.h"

namespace ckpt::internal {
namespace {

// For each planned raw storage, its range in `started` (ascending offsets); empty if some raw
// storage is not one of them.
std::vector<size_t> match_ranges(const LoadPlan& plan, const std::vector<ByteRange>& started) {
  const CheckpointModel& m = *plan.model;
  std::vector<size_t> range_of(plan.storages.size(), SIZE_MAX);
  for (size_t k = 0; k < plan.storages.size(); ++k) {
    const PlannedStorage& p = plan.storages[k];
    if (p.route != Route::kRead && p.route != Route::kView) continue;
    const StorageInfo& si = m.storages[p.storage];
    if (si.nbytes == 0) continue;
    auto it = std::lower_bound(started.begin(), started.end(), si.offset,
                               [](const ByteRange& r, uint64_t off) { return r.offset < off; });
    if (it == started.end() || it->offset != si.offset || it->size != si.nbytes) return {};
    range_of[k] = static_cast<size_t>(it - started.begin());
  }
  return range_of;
}

}  // namespace

std::vector<Tensor> execute_eager(const LoadPlan& plan, std::unique_ptr<Preload> started,
                                  const std::vector<ByteRange>& started_ranges,
                                  const PlacedFn& placed) {
  const CheckpointModel& m = *plan.model;
  // Raw storages go through the Preload's ranges; the others into "extra" bytes.
  std::vector<size_t> range_of;
  if (started) {
    range_of = match_ranges(plan, started_ranges);
    if (range_of.empty() && !plan.storages.empty()) started.reset();  // not covered: plain path
  }
  std::vector<size_t> decoded;  // plan positions of storages not read raw
  uint64_t meta_bytes = 0;
  std::vector<uint64_t> extra_off(plan.storages.size(), 0);
  uint64_t extra = 0;
  std::vector<PreloadRange> ranges;
  if (!started) range_of.assign(plan.storages.size(), SIZE_MAX);
  for (size_t k = 0; k < plan.storages.size(); ++k) {
    const PlannedStorage& p = plan.storages[k];
    const StorageInfo& si = m.storages[p.storage];
    if (p.route == Route::kRead || p.route == Route::kView) {
      if (!started) {
        range_of[k] = ranges.size();
        ranges.push_back({si.offset, si.nbytes});
      }
      continue;
    }
    if (p.route == Route::kZeros) {  // meta: no bytes of the arena (zero_pages below)
      meta_bytes += si.nbytes;
      continue;
    }
    decoded.push_back(k);
    extra_off[k] = extra;
    extra = align_up(extra + si.nbytes, kStorageAlign);
  }

  const bool had_started = started != nullptr;
  ProgressMeter meter(plan.progress, plan.progress ? plan_bytes(plan) : 0);
  std::unique_ptr<Preload> pre = std::move(started);
  std::shared_ptr<std::byte> extra_arena;
  std::byte* extra_base = nullptr;
  if (pre) {
    if (extra) {
      extra_arena = allocate_arena(extra);
      extra_base = extra_arena.get();
    }
  } else {
    pre = std::make_unique<Preload>(plan.copy, std::move(ranges), plan.verify, 0, extra,
                                    plan.drop_cache);
    extra_base = pre->extra_bytes();
  }
  if (meter.active()) pre->set_progress(&meter);
  progress_add(meter.active() ? &meter : nullptr, meta_bytes);

  // The storages and the tensor table are built before the bytes arrive (their addresses are
  // known): on a file of many small tensors that work overlaps the reads still running.
  std::vector<StoragePtr> storages(m.storages.size());
  for (size_t k = 0; k < plan.storages.size(); ++k) {
    const PlannedStorage& p = plan.storages[k];
    const std::byte* data = nullptr;  // an empty raw storage has no bytes
    std::shared_ptr<const void> owner = pre->arena();
    if (p.route == Route::kZeros) {
      // Zeros that cost nothing: a read-only mapping of the zero page, no memory, no writes.
      auto zeros = zero_pages(m.storages[p.storage].nbytes);
      storages[p.storage] = make_storage(m.storages[p.storage], zeros.get(), zeros, false);
      continue;
    }
    if (range_of[k] != SIZE_MAX) {
      data = pre->data(range_of[k]);
    } else if (p.route != Route::kRead && p.route != Route::kView) {
      data = extra_base + extra_off[k];
      if (extra_arena) owner = extra_arena;
    }
    storages[p.storage] = make_storage(m.storages[p.storage], data, std::move(owner), true);
  }
  std::vector<Tensor> out = plan_tensors(plan, storages);

  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mu;
  Preload& preload = *pre;
  auto worker = [&] {
    try {
      for (size_t j; (j = next.fetch_add(1)) < decoded.size();) {
        PlannedStorage p = plan.storages[decoded[j]];
        p.byteswap = false;  // swapped below with the raw ones
        load_into(plan, p, extra_base + extra_off[decoded[j]]);
        progress_add(meter.active() ? &meter : nullptr, m.storages[p.storage].nbytes);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mu);
      if (!failure) failure = std::current_exception();
      next = decoded.size();
    }
    preload.help();
  };
  // A Preload started at open has its own background threads; a pool is needed only for the
  // decoded storages then.
  std::vector<std::thread> pool;
  if (!had_started || !decoded.empty())
    for (int t = 1; t < plan.threads; ++t) pool.emplace_back(worker);
  if (placed) {
    // The caller's own work over the placed tensors, while the readers fill them.
    try {
      placed(out);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(failure_mu);
        if (!failure) failure = std::current_exception();
      }
      next = decoded.size();
    }
  }
  worker();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  pre->finish();
  pre->set_progress(nullptr);

  for (size_t k = 0; k < plan.storages.size(); ++k) {
    const PlannedStorage& p = plan.storages[k];
    const StorageInfo& si = m.storages[p.storage];
    if (range_of[k] != SIZE_MAX && p.check_crc && pre->crc(range_of[k]) != *si.crc32)
      throw crc_mismatch(m, p.storage, pre->crc(range_of[k]));
    if (p.byteswap && si.nbytes)
      byteswap_elements(const_cast<std::byte*>(storages[p.storage]->data), si.nbytes,
                        dtype_size(si.dtype), dtype_info(si.dtype).is_complex);
  }
  meter.finish();
  return out;
}

}  // namespace ckpt::internal
