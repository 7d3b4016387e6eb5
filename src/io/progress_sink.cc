// ProgressSink (include/ckpt/sink.h).

#include <algorithm>
#include <atomic>
#include <utility>

#include "ckpt/sink.h"

namespace ckpt {

namespace {
// A large write() (a whole tensor) is passed on in pieces of this size, so that progress moves
// through it. Writes of this size are far past the sinks' staging sizes: no cost.
constexpr size_t kPiece = 8 << 20;
}  // namespace

ProgressSink::ProgressSink(ByteSink& inner, uint64_t total, Callback fn,
                           std::chrono::steady_clock::duration every, uint64_t base)
    : inner_(inner),
      total_(total),
      base_(base),
      fn_(std::move(fn)),
      every_(every),
      caller_(std::this_thread::get_id()),
      last_(std::chrono::steady_clock::now()) {}

void ProgressSink::write(std::span<const std::byte> bytes) {
  while (bytes.size() > kPiece) {
    inner_.write(bytes.first(kPiece));
    bytes = bytes.subspan(kPiece);
    tick(inner_.position());
  }
  inner_.write(bytes);
  tick(inner_.position());
}

void ProgressSink::write_sliced(std::span<const std::byte> bytes, size_t slice,
                                const SliceVisitor& visit) {
  // The real sink may visit slices from two threads; each adds what it visited, and the
  // caller's thread reports (the callback never runs on a writer thread).
  const uint64_t base = inner_.position();
  std::atomic<uint64_t> visited{0};
  inner_.write_sliced(
      bytes, slice, [&](size_t index, uint64_t offset, std::span<const std::byte> piece) {
        visit(index, offset, piece);
        const uint64_t v =
            visited.fetch_add(piece.size(), std::memory_order_relaxed) + piece.size();
        if (std::this_thread::get_id() == caller_) tick(base + v);
      });
  tick(inner_.position());
}

void ProgressSink::tick(uint64_t done) {
  if (!fn_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < every_) return;
  last_ = now;
  reported_ = std::max(reported_, base_ + done);
  fn_(reported_, std::max(total_, reported_));
}

void ProgressSink::finish() {
  if (!fn_) return;
  const uint64_t n = std::max(reported_, base_ + inner_.position());
  reported_ = n;
  fn_(n, n);
}

}  // namespace ckpt
