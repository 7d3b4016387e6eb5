// The device pipeline (load/device_load.h): targets filled through the staging ring.

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "io/local_file.h"
#include "io/page_cache.h"
#include "load/device_load.h"
#include "util/arena.h"
#include "util/bytes.h"
#include "util/crc32.h"

namespace ckpt::internal {
namespace {

constexpr uint64_t kMinSlot = 1 << 20;
constexpr uint64_t kMaxSlot = 32 << 20;
constexpr uint64_t kCrcPiece = 1 << 20;

struct Item {
  size_t j;      // target
  uint64_t off;  // offset within the target
  uint64_t len;  // 0 with a decoded storage: the whole target, decoded first
  size_t piece;  // index of this chunk's CRC among the target's chunks
};

// The staging slot size for `readers` readers within `staging_bytes`, and the readers it allows.
uint64_t slot_size(uint64_t& staging_bytes, int& readers) {
  staging_bytes = std::max<uint64_t>(staging_bytes, 2 * kMinSlot);
  readers = static_cast<int>(std::min<uint64_t>(readers, staging_bytes / (2 * kMinSlot)));
  uint64_t slot =
      std::min<uint64_t>(kMaxSlot, staging_bytes / (2 * static_cast<uint64_t>(readers)));
  return slot / kMinSlot * kMinSlot;
}

// The file opened again with O_DIRECT for GPUDirect Storage (cuFile reads through the page cache
// in its compatibility mode otherwise); -1 where the filesystem refuses it.
struct DirectFd {
  int fd = -1;
  explicit DirectFd(int plain) {
    if (plain < 0) return;
    std::string self = "/proc/self/fd/" + std::to_string(plain);
    fd = ::open(self.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  }
  ~DirectFd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void fill_device(const LoadPlan& plan, CopyEngine& engine, const std::vector<DeviceTarget>& targets,
                 const LoadOptions& options, DeviceLoadStats* stats,
                 const PageCacheDropper* dropper, const TargetMaker& make) {
  const CheckpointModel& m = *plan.model;
  const size_t n = targets.size();
  // The targets' addresses: made up front, or while the readers read (`gate`).
  const bool overlap = device_overlap();
  TargetFeed feed;
  if (make && (!overlap || engine.unified())) make(feed);
  TargetFeed* gate = make && overlap && !engine.unified() ? &feed : nullptr;
  // Device memory the host writes directly (CopyEngine::unified): read into place, no ring.
  bool unified = engine.unified() && !gate;
  for (const DeviceTarget& t : targets)
    if (unified && t.len && !engine.host_accessible(t.dst)) unified = false;
  std::unique_ptr<PageCacheDropper> own_dropper;
  if (!dropper && plan.drop_cache && plan.copy) {
    own_dropper = PageCacheDropper::make(*plan.copy);
    dropper = own_dropper.get();
  }

  // The ring: two slots per reader, each at most kMaxSlot, all within the budget.
  int readers = std::max(1, plan.threads);
  uint64_t staging_bytes = host_staging_budget(options.staging_bytes);
  const uint64_t slot = slot_size(staging_bytes, readers);

  std::vector<Item> items;
  std::vector<size_t> chunks_of(n, 0);
  for (size_t j = 0; j < n; ++j) {
    const DeviceTarget& t = targets[j];
    const PlannedStorage& p = plan.storages[t.k];
    if (t.len == 0 || p.route == Route::kZeros) continue;  // meta: no bytes
    if (p.route == Route::kDecode) {
      items.push_back({j, 0, 0, 0});
      continue;
    }
    for (uint64_t off = 0; off < t.len; off += slot)
      items.push_back({j, off, std::min(slot, t.len - off), chunks_of[j]++});
  }
  readers = static_cast<int>(
      std::min<size_t>(static_cast<size_t>(readers), std::max<size_t>(items.size(), 1)));
  const uint64_t ring_bytes = unified ? 0 : slot * 2 * static_cast<uint64_t>(readers);
  // Two slots per reader, each reader's buffer its own: made by the reader as it starts, or all
  // here first without overlap.
  std::vector<std::shared_ptr<std::byte>> rings(static_cast<size_t>(readers));
  if (!unified && !overlap)
    for (auto& r : rings) r = engine.staging(2 * slot);

  // Direct reads (GPUDirect Storage) of the file, where the engine has them; a failed one falls
  // back to the ring for the rest of the load.
  std::unique_ptr<DirectFile> file;
  std::unique_ptr<DirectFd> direct_fd;
  if (options.gds && plan.copy && !unified) {
    std::string why;
    if (int fd = local_file_fd(*plan.copy); fd >= 0) {
      direct_fd = std::make_unique<DirectFd>(fd);
      if (direct_fd->fd >= 0) file = engine.open_direct(direct_fd->fd, why);
      if (!file) file = engine.open_direct(fd, why);
    }
  }
  std::atomic<bool> direct_ok{file != nullptr};
  std::atomic<uint64_t> direct_bytes{0};
  if (stats) {
    stats->readers = readers;
    stats->slot_bytes = slot;
    stats->staging_bytes = ring_bytes;
  }

  // Per target with a CRC to check (a whole raw storage): the CRC of each chunk, combined in
  // order at the end.
  auto checks_crc = [&](const DeviceTarget& t) {
    return plan.storages[t.k].check_crc && t.from == 0 &&
           t.len == m.storages[plan.storages[t.k].storage].nbytes;
  };
  std::vector<std::vector<uint32_t>> crcs(n);
  for (size_t j = 0; j < n; ++j)
    if (checks_crc(targets[j])) crcs[j].assign(chunks_of[j], 0);

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
      auto buf = [&](int s) { return rings[static_cast<size_t>(s / 2)].get() + (s & 1) * slot; };
      // Whether target j has its address (waiting for it); false: the load is stopping.
      auto ready = [&](size_t j) { return !gate || gate->wait(j); };
      auto* progress = meter.active() ? &meter : nullptr;
      try {
        if (!unified && !rings[static_cast<size_t>(r)])
          rings[static_cast<size_t>(r)] = engine.staging(2 * slot);
        for (size_t i;
             !stop.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < items.size();) {
          const Item& it = items[i];
          const DeviceTarget& t = targets[it.j];
          const PlannedStorage& p = plan.storages[t.k];
          const StorageInfo& si = m.storages[p.storage];
          if (p.route == Route::kDecode) {
            if (unified && t.from == 0 && t.len == si.nbytes) {
              load_into(plan, p, t.dst);  // decoded in place
              progress_add(progress, t.len);
              continue;
            }
            // Decoded into host memory first (the storage's size), then through the slots.
            std::unique_ptr<std::byte[]> host(new std::byte[si.nbytes]);
            if (unified) {
              load_into(plan, p, host.get());
              std::memcpy(t.dst, host.get() + t.from, t.len);
              progress_add(progress, t.len);
              continue;
            }
            load_into(plan, p, host.get());
            if (!ready(it.j)) break;
            for (uint64_t off = 0; off < t.len && !stop.load(std::memory_order_relaxed);
                 off += slot) {
              uint64_t len = std::min(slot, t.len - off);
              int s = take_slot();
              std::memcpy(buf(s), host.get() + t.from + off, len);
              session->copy(s, t.dst + off, buf(s), len);
            }
            session->wait(2 * r);
            session->wait(2 * r + 1);
            progress_add(progress, t.len);
            continue;
          }
          const bool crc = !crcs[it.j].empty();
          const uint64_t at = si.offset + t.from + it.off;
          if (direct_ok.load(std::memory_order_relaxed) && !crc && !p.byteswap) {
            if (!ready(it.j)) break;
            try {
              file->read(at, t.dst + it.off, it.len);
              direct_bytes += it.len;
              progress_add(progress, it.len);
              continue;
            } catch (const Error&) {
              direct_ok = false;  // this chunk, and the rest, through the ring
            }
          }
          // Unified memory: the bytes are read into their place; else into a staging slot.
          const int s = unified ? -1 : take_slot();
          std::byte* b = unified ? t.dst + it.off : buf(s);
          if (crc) {
            uint32_t c = 0;
            for (uint64_t d = 0; d < it.len; d += kCrcPiece) {
              std::span<std::byte> piece(b + d, std::min(kCrcPiece, it.len - d));
              plan.copy->read_into(at + d, piece);
              c = crc32(c, piece);
            }
            crcs[it.j][it.piece] = c;
          } else {
            plan.copy->read_into(at, std::span<std::byte>(b, it.len));
          }
          if (dropper) dropper->consumed(at, it.len);
          if (p.byteswap)
            byteswap_elements(b, it.len, dtype_size(si.dtype), dtype_info(si.dtype).is_complex);
          if (!unified) {
            if (!ready(it.j)) break;
            session->copy(s, t.dst + it.off, b, it.len);
          }
          progress_add(progress, it.len);
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mu);
        if (!failure) failure = std::current_exception();
        stop = true;
        if (gate) gate->close();  // the maker stops too
      }
    };
    // With a maker, every reader on a thread of its own: this thread makes the targets.
    std::vector<std::thread> pool;
    try {
      for (int r = gate ? 0 : 1; r < readers; ++r) pool.emplace_back(worker, r);
    } catch (...) {
      stop = true;
      feed.close();
      for (auto& t : pool) t.join();
      throw;
    }
    if (gate) {
      try {
        make(feed);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mu);
        if (!failure) failure = std::current_exception();
        stop = true;
      }
      feed.close();
    } else {
      worker(0);
    }
    for (auto& t : pool) t.join();
    // Every queued copy completes before the ring or the destinations can be freed.
    try {
      session->finish();
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mu);
      if (!failure) failure = std::current_exception();
    }
  }
  // Read-ahead for one reader may have brought back pages another had consumed and dropped.
  if (dropper) {
    std::vector<std::pair<uint64_t, uint64_t>> read;
    for (const DeviceTarget& t : targets)
      if (plan.storages[t.k].route != Route::kZeros)
        read.emplace_back(m.storages[plan.storages[t.k].storage].offset + t.from, t.len);
    dropper->consumed_all(std::move(read));
  }
  if (failure) std::rethrow_exception(failure);
  if (stats) {
    stats->direct_bytes = direct_bytes.load();
    stats->path = unified ? "unified" : stats->direct_bytes ? "gds" : "staged";
  }
  count_direct_bytes(direct_bytes.load());
  if (unified)
    for (const DeviceTarget& t : targets) count_unified_bytes(t.len);

  for (size_t j = 0; j < n; ++j) {
    if (crcs[j].empty()) continue;
    const uint32_t s = plan.storages[targets[j].k].storage;
    const StorageInfo& si = m.storages[s];
    uint32_t crc = crcs[j][0];
    for (size_t c = 1; c < crcs[j].size(); ++c) {
      uint64_t len = std::min(slot, si.nbytes - c * slot);
      crc = static_cast<uint32_t>(crc32_combine(crc, crcs[j][c], static_cast<z_off_t>(len)));
    }
    if (crc != *si.crc32) throw crc_mismatch(m, s, crc);
  }
  meter.finish();
}

}  // namespace ckpt::internal
