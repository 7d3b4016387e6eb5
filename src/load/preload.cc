#include "load/preload.h"

#include <zlib.h>

#include <algorithm>

#include "util/arena.h"
#include "util/bytes.h"
#include "util/crc32.h"

namespace ckpt::internal {
namespace {
constexpr uint64_t kChunk = 8 << 20;  // unit of work handed to a thread
constexpr uint64_t kSlice = 1 << 20;  // pread granularity: the CRC runs while the slice is in L2
}  // namespace

Preload::Preload(SourcePtr source, std::vector<PreloadRange> ranges, bool crc, int background,
                 uint64_t extra, bool drop_cache)
    : source_(std::move(source)), ranges_(std::move(ranges)), want_crc_(crc) {
  if (drop_cache) dropper_ = PageCacheDropper::make(*source_);
  const size_t n = ranges_.size();
  crc_.assign(n, 0);
  arena_off_.assign(n, 0);
  order_.resize(n);
  for (size_t i = 0; i < n; ++i) order_[i] = i;
  std::sort(order_.begin(), order_.end(),
            [&](size_t a, size_t b) { return ranges_[a].offset < ranges_[b].offset; });
  uint64_t total = 0, first = 0, last = 0;
  bool overlap = false;
  reach_.reserve(n);
  for (size_t i : order_) {
    total += ranges_[i].size;
    overlap |= ranges_[i].offset < last;
    last = std::max(last, ranges_[i].offset + ranges_[i].size);
    reach_.push_back(last);
  }
  if (n) first = ranges_[order_.front()].offset;
  // A remote source reads in pieces of its own size (each one several parallel requests).
  const uint64_t chunk = std::max(kChunk, source_->preferred_read_size());
  slice_ = std::max(kSlice, source_->preferred_read_size());
  auto add = [&](uint64_t file_off, uint64_t arena_off, uint64_t len, size_t range) {
    for (uint64_t done = 0; done < len; done += chunk)
      chunks_.push_back({file_off + done, arena_off + done, std::min(chunk, len - done), range});
  };
  uint64_t size = 0;
  // Mirror when dense (the gaps cost less than a 16th of the data, plus 1 MiB, to read along)
  // and disjoint (no format writes overlapping storages; a hostile file that does is read range
  // by range, so that each range's CRC is computed from its own slices).
  mirror_ = n > 0 && !overlap && last - first <= total + total / 16 + (1 << 20);
  if (mirror_) {
    const uint64_t base =
        first & ~(kStorageAlign - 1);  // keep the file's 64-byte alignment in memory
    for (size_t i = 0; i < n; ++i) arena_off_[i] = ranges_[i].offset - base;
    size = align_up(last - base, kStorageAlign);
    add(first, first - base, last - first, kAny);
  } else {
    for (size_t i : order_) {
      arena_off_[i] = size;
      add(ranges_[i].offset, size, ranges_[i].size, i);
      size = align_up(size + ranges_[i].size, kStorageAlign);
    }
  }
  extra_off_ = size;
  size += extra;
  if (size == 0) return;
  arena_ = allocate_arena(size);
  base_ = arena_.get();
  pieces_.resize(chunks_.size());
  background = std::min<int>(background, static_cast<int>(chunks_.size()) - 1);
  for (int t = 0; t < background; ++t) threads_.emplace_back([this] { work(); });
}

Preload::~Preload() {
  next_ = chunks_.size();  // stop early when finish() never ran (an error elsewhere)
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void Preload::crc_slice(size_t c, size_t k, uint64_t f0, uint64_t f1, const std::byte* src) {
  const PreloadRange& r = ranges_[k];
  const uint64_t s0 = std::max(f0, r.offset), s1 = std::min(f1, r.offset + r.size);
  if (s0 >= s1) return;
  const uint32_t crc = crc32(0, std::span<const std::byte>(src + (s0 - f0), s1 - s0));
  auto& pv = pieces_[c];
  if (!pv.empty() && pv.back().range == k && pv.back().start + pv.back().len == s0 - r.offset) {
    pv.back().crc =
        static_cast<uint32_t>(crc32_combine(pv.back().crc, crc, static_cast<z_off_t>(s1 - s0)));
    pv.back().len += s1 - s0;
  } else {
    pv.push_back({k, s0 - r.offset, crc, s1 - s0});
  }
}

void Preload::work() noexcept {
  try {
    for (size_t c; (c = next_.fetch_add(1)) < chunks_.size();) {
      const Chunk& ch = chunks_[c];
      for (uint64_t done = 0; done < ch.len; done += slice_) {
        const uint64_t n = std::min(slice_, ch.len - done);
        const uint64_t f0 = ch.file_off + done, f1 = f0 + n;
        std::byte* dst = base_ + ch.arena_off + done;
        source_->read_into(f0, std::span<std::byte>(dst, n));
        if (dropper_) dropper_->consumed(f0, n);
        progress_add(progress_.load(std::memory_order_acquire), n);
        if (!want_crc_) continue;
        if (ch.range != kAny) {
          crc_slice(c, ch.range, f0, f1, dst);
          continue;
        }
        // Mirror (disjoint ranges): every range that touches the slice, starting with the one
        // that begins at or before f0.
        size_t j = std::upper_bound(order_.begin(), order_.end(), f0,
                                    [&](uint64_t v, size_t i) { return v < ranges_[i].offset; }) -
                   order_.begin();
        if (j > 0 && reach_[j - 1] > f0) --j;
        for (; j < order_.size() && ranges_[order_[j]].offset < f1; ++j)
          crc_slice(c, order_[j], f0, f1, dst);
      }
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_) failure_ = std::current_exception();
    next_ = chunks_.size();
  }
}

void Preload::finish() {
  if (finished_) return;
  finished_ = true;
  work();
  for (auto& t : threads_) t.join();
  threads_.clear();
  // Read-ahead for one reader may have brought back pages another had consumed and dropped.
  if (dropper_) {
    std::vector<std::pair<uint64_t, uint64_t>> read;
    for (const PreloadRange& r : ranges_) read.emplace_back(r.offset, r.size);
    dropper_->consumed_all(std::move(read));
  }
  if (failure_) std::rethrow_exception(failure_);
  if (!want_crc_) return;
  // A range's pieces, in chunk order, are in file order: combine them.
  for (const auto& pv : pieces_)
    for (const Piece& p : pv)
      crc_[p.range] =
          static_cast<uint32_t>(crc32_combine(crc_[p.range], p.crc, static_cast<z_off_t>(p.len)));
}

}  // namespace ckpt::internal
