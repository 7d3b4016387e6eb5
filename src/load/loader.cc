// Eager loading: a plan over the selected storages, one huge-page arena, several reader threads
// doing positional reads straight into their final place, CRC32 fused with the reads.
//
// When the selected storages are dense in the file (torch zips: only ~100 bytes of zip headers
// between records), the arena mirrors the file range [first, last) so that the whole range is
// read with a few large reads and every storage lands at its final address; otherwise storages
// are packed one after another (64-byte aligned) and read one by one.

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "ckpt/checkpoint.h"
#include "load/checkpoint_data.h"
#include "util/arena.h"
#include "util/crc32.h"

namespace ckpt {
namespace {

struct Chunk {
  uint64_t file_off, arena_off, len;
};
struct Piece {  // part of a storage's CRC, computed by one chunk
  size_t storage;
  uint64_t start;  // offset within the storage
  uint32_t crc;
  uint64_t len;
};

constexpr uint64_t kChunk = 8 << 20;
constexpr uint64_t kSlice = 1 << 20;  // pread granularity: the CRC runs while the slice is in L2

}  // namespace

std::vector<Tensor> Checkpoint::load_all(
    const LoadOptions& options, const std::function<bool(const TensorInfo&)>& filter) const {
  const internal::CheckpointData& d = *data_;
  std::vector<size_t> wanted;
  std::vector<uint8_t> need(d.storages.size(), 0);
  for (size_t i = 0; i < d.tensors.size(); ++i) {
    if (filter && !filter(d.tensors[i])) continue;
    wanted.push_back(i);
    need[d.tensors[i].storage] = 1;
  }
  // Raw storages (read from the file) vs decoded ones (decrypt/inflate/meta).
  std::vector<size_t> raw, decoded;
  for (size_t s = 0; s < d.storages.size(); ++s) {
    if (!need[s]) continue;
    const StorageInfo& si = d.storages[s];
    bool is_raw = !si.meta && si.offset != kNoOffset && !(d.decoder && d.decode_all);
    (is_raw ? raw : decoded).push_back(s);
  }
  std::sort(raw.begin(), raw.end(),
            [&](size_t a, size_t b) { return d.storages[a].offset < d.storages[b].offset; });

  // Layout.
  uint64_t raw_bytes = 0;
  for (size_t s : raw) raw_bytes += d.storages[s].nbytes;
  bool mirror = false;
  uint64_t first = 0, last = 0;
  if (!raw.empty()) {
    first = d.storages[raw.front()].offset;
    for (size_t s : raw) last = std::max(last, d.storages[s].offset + d.storages[s].nbytes);
    mirror = (last - first) <= raw_bytes + raw_bytes / 16 + (1 << 20);
    // Overlapping storages (never written by torch) are read twice in packed mode; keep mirror.
  }
  std::vector<uint64_t> arena_off(d.storages.size(), 0);
  uint64_t size = 0;
  std::vector<Chunk> chunks;
  auto add_segment = [&](uint64_t file_off, uint64_t a_off, uint64_t len) {
    for (uint64_t done = 0; done < len; done += kChunk)
      chunks.push_back({file_off + done, a_off + done, std::min(kChunk, len - done)});
  };
  if (mirror) {
    uint64_t base = first & ~uint64_t(63);  // keep the file's 64-byte alignment in memory
    for (size_t s : raw) arena_off[s] = d.storages[s].offset - base;
    size = last - base;
    add_segment(first, first - base, last - first);
  } else {
    for (size_t s : raw) {
      arena_off[s] = size;
      add_segment(d.storages[s].offset, size, d.storages[s].nbytes);
      size = (size + d.storages[s].nbytes + 63) & ~uint64_t(63);
    }
  }
  for (size_t s : decoded) {
    arena_off[s] = size;
    size = (size + d.storages[s].nbytes + 63) & ~uint64_t(63);
  }
  auto arena = internal::allocate_arena(size);
  std::byte* base = arena.get();

  // Storage lookup by file offset, for the CRC pieces of each chunk.
  std::vector<uint64_t> starts;
  for (size_t s : raw) starts.push_back(d.storages[s].offset);

  std::vector<std::vector<Piece>> pieces(chunks.size());
  SourcePtr src = d.copy_source();
  std::atomic<size_t> next_chunk{0}, next_decoded{0};
  std::exception_ptr failure;
  std::mutex failure_mu;
  auto worker = [&] {
    try {
      for (size_t c; (c = next_chunk.fetch_add(1)) < chunks.size();) {
        const Chunk& ch = chunks[c];
        for (uint64_t done = 0; done < ch.len; done += kSlice) {
          uint64_t n = std::min(kSlice, ch.len - done);
          uint64_t f0 = ch.file_off + done, f1 = f0 + n;
          std::byte* dst = base + ch.arena_off + done;
          src->read_into(f0, std::span<std::byte>(dst, n));
          if (!options.verify) continue;
          // CRC of each storage's part of this slice, merged into the chunk's pieces.
          size_t k = std::upper_bound(starts.begin(), starts.end(), f0) - starts.begin();
          if (k > 0) --k;
          for (; k < raw.size() && d.storages[raw[k]].offset < f1; ++k) {
            const StorageInfo& si = d.storages[raw[k]];
            if (!si.crc32) continue;
            uint64_t s0 = std::max(f0, si.offset), s1 = std::min(f1, si.offset + si.nbytes);
            if (s0 >= s1) continue;
            uint32_t crc = internal::crc32(
                0, std::span<const std::byte>(dst + (s0 - f0), s1 - s0));
            auto& pv = pieces[c];
            if (!pv.empty() && pv.back().storage == raw[k] &&
                pv.back().start + pv.back().len == s0 - si.offset) {
              pv.back().crc = static_cast<uint32_t>(
                  crc32_combine(pv.back().crc, crc, static_cast<z_off_t>(s1 - s0)));
              pv.back().len += s1 - s0;
            } else {
              pv.push_back({raw[k], s0 - si.offset, crc, s1 - s0});
            }
          }
        }
      }
      for (size_t k; (k = next_decoded.fetch_add(1)) < decoded.size();) {
        size_t s = decoded[k];
        const StorageInfo& si = d.storages[s];
        std::byte* dst = base + arena_off[s];
        if (si.meta)
          std::memset(dst, 0, si.nbytes);
        else
          d.decoder->read(s, std::span<std::byte>(dst, si.nbytes), options.verify);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mu);
      if (!failure) failure = std::current_exception();
      next_chunk = chunks.size();
      next_decoded = decoded.size();
    }
  };
  int threads = options.threads > 0 ? options.threads : internal::default_threads();
  threads = static_cast<int>(std::min<size_t>(threads, std::max<size_t>(1, chunks.size() + decoded.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);

  if (options.verify) {
    // Combine each storage's pieces in file order and compare.
    std::vector<uint32_t> crc(d.storages.size(), 0);
    std::vector<uint64_t> seen(d.storages.size(), 0);
    for (auto& pv : pieces)
      for (const Piece& p : pv) {
        crc[p.storage] = static_cast<uint32_t>(
            crc32_combine(crc[p.storage], p.crc, static_cast<z_off_t>(p.len)));
        seen[p.storage] += p.len;
      }
    for (size_t s : raw) {
      const StorageInfo& si = d.storages[s];
      if (si.crc32 && (crc[s] != *si.crc32 || seen[s] != si.nbytes)) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "CRC32 mismatch: stored %08x, computed %08x", *si.crc32,
                      crc[s]);
        std::string names;
        for (const auto& t : d.tensors)
          if (t.storage == s) names += (names.empty() ? "" : ", ") + t.name;
        throw Error(ErrorCode::kCorrupt, std::string(buf) + " (tensors: " + names + ")",
                    d.source->name(), si.record.empty() ? si.key : si.record, si.offset);
      }
    }
  }

  std::vector<StoragePtr> storages(d.storages.size());
  for (size_t s = 0; s < d.storages.size(); ++s) {
    if (!need[s]) continue;
    auto st = std::make_shared<Storage>();
    st->info = d.storages[s];
    st->data = base + arena_off[s];
    st->owner = arena;
    if (st->info.byteswap)
      internal::byteswap_elements(st->data, st->info.nbytes, dtype_size(st->info.dtype),
                                  dtype_info(st->info.dtype).is_complex);
    storages[s] = std::move(st);
  }
  std::vector<Tensor> out;
  out.reserve(wanted.size());
  for (size_t i : wanted) out.emplace_back(d.tensors[i], storages[d.tensors[i].storage]);
  return out;
}

}  // namespace ckpt
