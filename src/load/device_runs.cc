// The device load of byte ranges (load/device_load.h: fill_device_runs): runs packed into
// pinned staging slots, each slot read by one reader and copied on by the engine.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "load/device_load.h"
#include "util/arena.h"
#include "util/bytes.h"

namespace ckpt::internal {
namespace {

constexpr uint64_t kMinSlot = 1 << 20;
constexpr uint64_t kMaxSlot = 32 << 20;

// Bytes [off, off + len) of runs[run].
struct Piece {
  size_t run;
  uint64_t off, len;
};

// What one slot carries: pieces [first, last), whose destinations follow one another from dst.
struct Chunk {
  size_t first, last;
  uint64_t len;
  std::byte* dst;
};

// The runs cut into slot-sized chunks: a chunk takes the next run's bytes while they continue
// its destination and fit the slot.
std::vector<Chunk> pack(std::span<const DeviceRun> runs, uint64_t slot,
                        std::vector<Piece>& pieces) {
  std::vector<Chunk> chunks;
  for (size_t r = 0; r < runs.size(); ++r) {
    const DeviceRun& run = runs[r];
    for (uint64_t off = 0; off < run.len;) {
      std::byte* at = run.dst + off;
      if (chunks.empty() || chunks.back().len == slot ||
          chunks.back().dst + chunks.back().len != at)
        chunks.push_back({pieces.size(), pieces.size(), 0, at});
      Chunk& c = chunks.back();
      const uint64_t take = std::min(slot - c.len, run.len - off);
      pieces.push_back({r, off, take});
      c.last = pieces.size();
      c.len += take;
      off += take;
    }
  }
  return chunks;
}

// A chunk's bytes into `buf`: host runs copied, the others read with one read_batch per source.
void stage(const Chunk& c, const std::vector<Piece>& pieces, std::span<const DeviceRun> runs,
           std::byte* buf) {
  std::vector<std::pair<const ByteSource*, std::vector<ReadRequest>>> reads;
  uint64_t at = 0;
  for (size_t p = c.first; p < c.last; ++p) {
    const Piece& pc = pieces[p];
    const DeviceRun& run = runs[pc.run];
    std::span<std::byte> to(buf + at, pc.len);
    at += pc.len;
    if (!run.source) {
      std::memcpy(to.data(), run.host + pc.off, pc.len);
      continue;
    }
    auto it = std::find_if(reads.begin(), reads.end(),
                           [&](const auto& r) { return r.first == run.source; });
    if (it == reads.end()) it = reads.emplace(reads.end(), run.source, std::vector<ReadRequest>{});
    it->second.push_back({run.offset + pc.off, to});
  }
  for (auto& r : reads) r.first->read_batch(r.second);
}

}  // namespace

void fill_device_runs(CopyEngine& engine, std::span<const DeviceRun> runs,
                      const LoadOptions& options, DeviceLoadStats* stats) {
  uint64_t total = 0;
  for (const DeviceRun& r : runs) total += r.len;
  if (total == 0) return;
  // Two slots per reader within the staging budget, no larger than the bytes to move.
  uint64_t staging = std::max<uint64_t>(host_staging_budget(options.staging_bytes), 2 * kMinSlot);
  int readers = options.threads > 0 ? options.threads : default_threads();
  readers = static_cast<int>(std::clamp<uint64_t>(staging / (2 * kMinSlot), 1,
                                                  static_cast<uint64_t>(std::max(1, readers))));
  uint64_t slot = std::min<uint64_t>(kMaxSlot, staging / (2 * static_cast<uint64_t>(readers)));
  slot = std::min(slot / kMinSlot * kMinSlot, align_up(total, 4096));
  std::vector<Piece> pieces;
  const std::vector<Chunk> chunks = pack(runs, slot, pieces);
  readers = static_cast<int>(std::min<size_t>(static_cast<size_t>(readers), chunks.size()));
  std::shared_ptr<std::byte> ring = engine.staging(slot * 2 * static_cast<uint64_t>(readers));
  if (stats) {
    stats->readers = readers;
    stats->slot_bytes = slot;
    stats->staging_bytes = slot * 2 * static_cast<uint64_t>(readers);
  }

  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::exception_ptr failure;
  std::mutex failure_mu;
  auto fail = [&] {
    std::lock_guard<std::mutex> lock(failure_mu);
    if (!failure) failure = std::current_exception();
    stop = true;
  };
  {
    std::unique_ptr<CopySession> session = engine.start(2 * readers, std::max(2, readers));
    auto worker = [&](int r) {
      try {
        for (size_t i, turn = 0;
             !stop.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < chunks.size();) {
          const int s = 2 * r + static_cast<int>(turn++ & 1);
          session->wait(s);  // its last copy is done: the slot may be overwritten
          std::byte* buf = ring.get() + static_cast<uint64_t>(s) * slot;
          stage(chunks[i], pieces, runs, buf);
          session->copy(s, chunks[i].dst, buf, chunks[i].len);
        }
      } catch (...) {
        fail();
      }
    };
    std::vector<std::thread> pool;
    try {
      for (int r = 1; r < readers; ++r) pool.emplace_back(worker, r);
    } catch (...) {
      fail();
    }
    worker(0);
    for (auto& t : pool) t.join();
    // Every queued copy completes before the ring or the destinations can be freed.
    try {
      session->finish();
    } catch (...) {
      fail();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace ckpt::internal
