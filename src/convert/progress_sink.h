#pragma once
// A sink that counts the bytes written through it for a progress callback, passing everything
// on to the real sink: reserve() and write_sliced() included, so that the real sink's fast
// paths (a file sink's preallocation and two-thread slice writes) stay in use.

#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "ckpt/sink.h"

namespace ckpt::internal {

class ProgressSink final : public ByteSink {
 public:
  using Callback = std::function<void(uint64_t done, uint64_t total)>;
  // `total`: the expected size (reported raised to what was written when that passes it).
  // `fn` is called on the constructing thread only, at most once per `every`. `base`: bytes
  // written before this sink (earlier files of the same output), added to what it reports.
  ProgressSink(ByteSink& inner, uint64_t total, const Callback& fn,
               std::chrono::steady_clock::duration every, uint64_t base = 0);

  const std::string& name() const override { return inner_.name(); }
  void write(std::span<const std::byte> bytes) override;
  using ByteSink::write;
  void patch(uint64_t offset, std::span<const std::byte> bytes) override {
    inner_.patch(offset, bytes);
  }
  uint64_t position() const override { return inner_.position(); }
  void reserve(uint64_t size) override { inner_.reserve(size); }
  void write_sliced(std::span<const std::byte> bytes, size_t slice,
                    const SliceVisitor& visit) override;
  void commit() override { inner_.commit(); }

  // The last call: done == total == base + position().
  void finish();

 private:
  void tick(uint64_t done);

  ByteSink& inner_;
  const uint64_t total_;
  const uint64_t base_;
  const Callback& fn_;
  const std::chrono::steady_clock::duration every_;
  const std::thread::id caller_;
  std::chrono::steady_clock::time_point last_;
  uint64_t reported_ = 0;
};

}  // namespace ckpt::internal
