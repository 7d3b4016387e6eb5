#pragma once
// For the rank-load tests: a RankExchange over threads of one process, ThreadGroup(n) and one
// Member per thread (fail_rank: that member's all_gather throws, as a lost peer would; a member
// left waiting longer than `timeout` for the others throws, as torch.distributed's timeout does),
// and a file source that shows each read to the test (WatchedSource).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckpt/rank_plan.h"
#include "ckpt/source.h"
#include "ckpt/tensor.h"

namespace ckpt::test {

// A float32 tensor of `shape` whose element k is first + k: each test model numbers its tensors'
// values apart, so that a byte in the wrong place shows.
inline Tensor numbered_floats(std::string name, std::vector<int64_t> shape, size_t first) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(first + k);
  return Tensor::copy_of(std::move(name), DType::kFloat32, std::move(shape),
                         std::as_bytes(std::span<const float>(v)));
}

// An all-gather over threads of one process.
class ThreadGroup {
 public:
  explicit ThreadGroup(int n, std::chrono::milliseconds timeout = std::chrono::seconds(120))
      : n_(n), slots_(n), timeout_(timeout) {}
  class Member final : public RankExchange {
   public:
    Member(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
    int rank() const override { return rank_; }
    int world() const override { return g_.n_; }
    void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) override {
      if (rank_ == g_.fail_rank) throw std::runtime_error("connection closed by peer");
      g_.slots_[rank_].assign(mine.begin(), mine.end());
      g_.arrive_and_wait();
      for (int k = 0; k < g_.n_; ++k)
        std::memcpy(all.data() + k * mine.size(), g_.slots_[k].data(), mine.size());
      g_.arrive_and_wait();
      ++calls;
    }
    int calls = 0;

   private:
    ThreadGroup& g_;
    int rank_;
  };
  int fail_rank = -1;

 private:
  // A barrier that gives up after timeout_ (the group is then broken, as a real one would be).
  void arrive_and_wait() {
    std::unique_lock<std::mutex> l(m_);
    const uint64_t phase = phase_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++phase_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(l, timeout_, [&] { return phase_ != phase; }))
      throw std::runtime_error("timed out waiting for the other ranks");
  }
  int n_;
  std::vector<std::vector<std::byte>> slots_;
  std::chrono::milliseconds timeout_;
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t phase_ = 0;
};

// A file read through read_into only (no mapping), each read once watch() has been called (after
// Checkpoint::open, which reads the header and more) shown to on_read(offset, length) first, on
// the reading thread: it may record it, wait, or throw as a failing disk would.
class WatchedSource final : public ByteSource {
 public:
  WatchedSource(const std::string& path, std::function<void(uint64_t, uint64_t)> on_read)
      : inner_(open_file_source(path)), on_read_(std::move(on_read)) {}
  uint64_t size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  void watch() { watching_ = true; }
  void read_into(uint64_t offset, std::span<std::byte> dst) const override {
    if (watching_) on_read_(offset, dst.size());
    inner_->read_into(offset, dst);
  }

 private:
  SourcePtr inner_;
  std::function<void(uint64_t, uint64_t)> on_read_;
  std::atomic<bool> watching_{false};
};

}  // namespace ckpt::test
