// The device executor (load/device_load.h).

#include "load/device_load.h"

#include <zlib.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "io/local_file.h"
#include "util/arena.h"
#include "util/bytes.h"
#include "util/crc32.h"

namespace ckpt::internal {
namespace {

constexpr uint64_t kDeviceAlign = 256;
constexpr uint64_t kMinSlot = 1 << 20;
constexpr uint64_t kMaxSlot = 32 << 20;
constexpr uint64_t kCrcPiece = 1 << 20;

struct Item {
  size_t k;          // plan position
  uint64_t off;      // offset within the storage
  uint64_t len;      // 0 with a decoded storage: the whole storage, decoded first
  size_t piece;      // index of this chunk's CRC among the storage's chunks
};

// The staging slot size for `readers` readers within `staging_bytes`, and the readers it allows.
uint64_t slot_size(uint64_t& staging_bytes, int& readers) {
  staging_bytes = std::max<uint64_t>(staging_bytes, 2 * kMinSlot);
  readers = static_cast<int>(std::min<uint64_t>(readers, staging_bytes / (2 * kMinSlot)));
  uint64_t slot = std::min<uint64_t>(kMaxSlot, staging_bytes / (2 * static_cast<uint64_t>(readers)));
  return slot / kMinSlot * kMinSlot;
}

}  // namespace

std::vector<StoragePtr> execute_device(const LoadPlan& plan, const Device& device,
                                       uint64_t staging_bytes, bool direct,
                                       DeviceLoadStats* stats) {
  if (engine_ready(device) || !plan.copy || !is_local_file(*plan.copy))
    return execute_device(plan, engine_for(device), staging_bytes, direct, stats);
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
  std::vector<StoragePtr> out = execute_device(plan, *engine, staging_bytes, direct, stats);
  if (stats) stats->warmed_bytes = warmed.load();
  return out;
}

std::vector<StoragePtr> execute_device(const LoadPlan& plan, CopyEngine& engine,
                                       uint64_t staging_bytes, bool direct,
                                       DeviceLoadStats* stats) {
  const CheckpointModel& m = *plan.model;
  const size_t n = plan.storages.size();

  // The ring: two slots per reader, each at most kMaxSlot, all within the budget.
  int readers = std::max(1, plan.threads);
  const uint64_t slot = slot_size(staging_bytes, readers);

  // Where each storage goes, and the chunks that fill it.
  std::vector<uint64_t> dev_off(n, 0);
  std::vector<Item> items;
  std::vector<size_t> chunks_of(n, 0);
  uint64_t total = 0;
  for (size_t k = 0; k < n; ++k) {
    const PlannedStorage& p = plan.storages[k];
    const StorageInfo& si = m.storages[p.storage];
    dev_off[k] = total;
    total = align_up(total + si.nbytes, kDeviceAlign);
    if (si.nbytes == 0) continue;
    if (p.route == Route::kDecode) {
      items.push_back({k, 0, 0, 0});
      continue;
    }
    for (uint64_t off = 0; off < si.nbytes; off += slot)
      items.push_back({k, off, std::min(slot, si.nbytes - off), chunks_of[k]++});
  }
  readers = static_cast<int>(std::min<size_t>(static_cast<size_t>(readers), std::max<size_t>(items.size(), 1)));

  std::shared_ptr<std::byte> arena = engine.allocate(std::max<uint64_t>(total, 1));
  std::shared_ptr<std::byte> ring = engine.staging(slot * 2 * static_cast<uint64_t>(readers));
  // Direct reads (GPUDirect Storage) of the file, where the engine has them.
  std::unique_ptr<DirectFile> file;
  if (direct && plan.copy) {
    std::string why;
    if (int fd = local_file_fd(*plan.copy); fd >= 0) file = engine.open_direct(fd, why);
  }
  std::atomic<uint64_t> direct_bytes{0};
  if (stats) *stats = {0, 0, readers, slot, slot * 2 * static_cast<uint64_t>(readers), total};

  // Per raw storage with a CRC to check: the CRC of each chunk, combined in order at the end.
  std::vector<std::vector<uint32_t>> crcs(n);
  for (size_t k = 0; k < n; ++k)
    if (plan.storages[k].check_crc) crcs[k].assign(chunks_of[k], 0);

  ProgressMeter meter(plan.progress, plan.progress ? plan_bytes(plan) : 0);
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::exception_ptr failure;
  std::mutex failure_mu;
  {
    std::unique_ptr<CopySession> session = engine.start(2 * readers, std::max(2, readers));
    auto worker = [&](int r) {
      int turn = 0;
      auto take_slot = [&] {
        int s = 2 * r + (turn++ & 1);
        session->wait(s);  // its last copy is done: the bytes may be overwritten
        return s;
      };
      auto buf = [&](int s) { return ring.get() + static_cast<uint64_t>(s) * slot; };
      try {
        for (size_t i; !stop.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < items.size();) {
          const Item& it = items[i];
          const PlannedStorage& p = plan.storages[it.k];
          const StorageInfo& si = m.storages[p.storage];
          std::byte* dst = arena.get() + dev_off[it.k];
          if (p.route == Route::kDecode) {
            // Decoded into host memory first (its own size), then through the slots.
            std::unique_ptr<std::byte[]> host(new std::byte[si.nbytes]);
            load_into(plan, p, host.get());
            for (uint64_t off = 0; off < si.nbytes && !stop.load(std::memory_order_relaxed); off += slot) {
              uint64_t len = std::min(slot, si.nbytes - off);
              int s = take_slot();
              std::memcpy(buf(s), host.get() + off, len);
              session->copy(s, dst + off, buf(s), len);
            }
            session->wait(2 * r);
            session->wait(2 * r + 1);
            progress_add(meter.active() ? &meter : nullptr, si.nbytes);
            continue;
          }
          if (file && p.route != Route::kZeros && !p.check_crc && !p.byteswap) {
            try {
              file->read(si.offset + it.off, dst + it.off, it.len);
            } catch (const Error& e) {
              throw Error(e.code(), e.message(), plan.copy->name(), si.key, e.offset());
            }
            direct_bytes += it.len;
            progress_add(meter.active() ? &meter : nullptr, it.len);
            continue;
          }
          int s = take_slot();
          std::byte* b = buf(s);
          if (p.route == Route::kZeros) {
            std::memset(b, 0, it.len);
          } else if (p.check_crc) {
            uint32_t crc = 0;
            for (uint64_t d = 0; d < it.len; d += kCrcPiece) {
              std::span<std::byte> piece(b + d, std::min(kCrcPiece, it.len - d));
              plan.copy->read_into(si.offset + it.off + d, piece);
              crc = crc32(crc, piece);
            }
            crcs[it.k][it.piece] = crc;
          } else {
            plan.copy->read_into(si.offset + it.off, std::span<std::byte>(b, it.len));
          }
          if (p.byteswap)
            byteswap_elements(b, it.len, dtype_size(si.dtype), dtype_info(si.dtype).is_complex);
          session->copy(s, dst + it.off, b, it.len);
          progress_add(meter.active() ? &meter : nullptr, it.len);
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mu);
        if (!failure) failure = std::current_exception();
        stop = true;
      }
    };
    std::vector<std::thread> pool;
    try {
      for (int r = 1; r < readers; ++r) pool.emplace_back(worker, r);
    } catch (...) {
      stop = true;
      for (auto& t : pool) t.join();
      throw;
    }
    worker(0);
    for (auto& t : pool) t.join();
    // Every queued copy completes before the ring or the arena can be freed.
    try {
      session->finish();
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mu);
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  if (stats) stats->direct_bytes = direct_bytes.load();

  for (size_t k = 0; k < n; ++k) {
    if (crcs[k].empty()) continue;
    const StorageInfo& si = m.storages[plan.storages[k].storage];
    uint32_t crc = crcs[k][0];
    for (size_t c = 1; c < crcs[k].size(); ++c) {
      uint64_t len = std::min(slot, si.nbytes - c * slot);
      crc = static_cast<uint32_t>(crc32_combine(crc, crcs[k][c], static_cast<z_off_t>(len)));
    }
    if (crc != *si.crc32) throw crc_mismatch(m, plan.storages[k].storage, crc);
  }
  meter.finish();

  std::vector<StoragePtr> storages(m.storages.size());
  for (size_t k = 0; k < n; ++k) {
    const PlannedStorage& p = plan.storages[k];
    StoragePtr st = make_storage(m.storages[p.storage], arena.get() + dev_off[k], arena, false);
    st->device = engine.device();
    storages[p.storage] = std::move(st);
  }
  return storages;
}

}  // namespace ckpt::internal
