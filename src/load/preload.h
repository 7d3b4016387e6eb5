#pragma once
// Preload: reads byte ranges of a file into one huge-page arena with several threads doing
// positional reads of 1 MiB slices straight into place, and (optionally) the CRC32 of every
// range fused with the reads while each slice is hot in L2.
//
// Layout: when the ranges are dense in the file (torch zips: ~100 bytes of zip headers between
// records) the arena mirrors the file span [first, last), so the whole span is read in a few
// large reads and every range lands at its final address; otherwise ranges are packed one after
// another (64-byte aligned) and read one by one.
//
// It is the data path of every eager load: Checkpoint::load_all, and Checkpoint::load (open and
// load at once), where it starts as soon as the zip central directory has named the records —
// background threads read tensor bytes while the caller is still unpickling data.pkl, and the
// caller joins the reading when it is done (finish()).

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ckpt/source.h"
#include "io/page_cache.h"
#include "util/progress.h"

namespace ckpt::internal {

struct PreloadRange {
  uint64_t offset = 0;  // absolute file offset
  uint64_t size = 0;
};

class Preload {
 public:
  // Starts reading `ranges` (any order; they may overlap) of `source`. `background` threads
  // start now; finish() adds the caller. `extra` more arena bytes (64-byte aligned, after the
  // ranges) are left for the caller (extra_bytes()). With `drop_cache` (a local file), each
  // slice's pages that were not cached when the Preload began leave the page cache once read
  // (io/page_cache.h). Throws Error{kIo} if the arena cannot be had.
  Preload(SourcePtr source, std::vector<PreloadRange> ranges, bool crc, int background,
          uint64_t extra = 0, bool drop_cache = false);
  ~Preload();  // stops and joins (errors are dropped if finish() was never called)
  Preload(const Preload&) = delete;
  Preload& operator=(const Preload&) = delete;

  // Reads chunks until none is left; any number of threads may call it (a caller's own pool).
  // Errors are kept for finish().
  void help() noexcept { work(); }
  // The caller reads what is left, then all threads are joined. Throws the first read error.
  void finish();

  // Where ranges[i] landed. Valid while arena() lives.
  std::byte* data(size_t i) const { return base_ + arena_off_[i]; }
  std::byte* extra_bytes() const { return base_ + extra_off_; }
  const std::shared_ptr<std::byte>& arena() const { return arena_; }
  // Counts every slice read from now on into `meter` (which must outlive the reads); may be
  // set while background threads read.
  void set_progress(ProgressMeter* meter) { progress_.store(meter, std::memory_order_release); }
  bool mirrored() const { return mirror_; }
  // After finish(), with `crc`: the CRC32 of ranges[i].
  uint32_t crc(size_t i) const { return crc_[i]; }

 private:
  static constexpr size_t kAny = SIZE_MAX;
  struct Chunk {
    uint64_t file_off, arena_off, len;
    size_t range;  // packed layout: the range it belongs to; mirror: kAny
  };
  struct Piece {  // part of a range's CRC, computed within one chunk
    size_t range;
    uint64_t start;  // offset within the range
    uint32_t crc;
    uint64_t len;
  };
  void work() noexcept;
  void crc_slice(size_t chunk, size_t range, uint64_t f0, uint64_t f1, const std::byte* src);

  SourcePtr source_;
  std::unique_ptr<PageCacheDropper> dropper_;  // drop_cache
  std::atomic<ProgressMeter*> progress_{nullptr};
  std::vector<PreloadRange> ranges_;
  std::vector<size_t> order_;    // range indices by file offset
  std::vector<uint64_t> reach_;  // max end of the ranges order_[0..i]
  bool want_crc_;
  bool mirror_ = false;
  uint64_t slice_ = 1 << 20;  // bytes per read_into (a remote source: its preferred read size)
  std::vector<uint64_t> arena_off_;
  uint64_t extra_off_ = 0;
  std::shared_ptr<std::byte> arena_;
  std::byte* base_ = nullptr;
  std::vector<Chunk> chunks_;
  std::vector<std::vector<Piece>> pieces_;  // per chunk
  std::vector<uint32_t> crc_;
  std::atomic<size_t> next_{0};
  std::mutex mu_;
  std::exception_ptr failure_;
  std::vector<std::thread> threads_;
  bool finished_ = false;
};

}  // namespace ckpt::internal
