#pragma once
// A RankExchange over threads of one process, for the rank-load tests: ThreadGroup(n) and one
// Member per thread (fail_rank: that member's all_gather throws, as a lost peer would).

#include <barrier>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include "ckpt/rank_plan.h"

namespace ckpt::test {

// An all-gather over threads of one process.
class ThreadGroup {
 public:
  explicit ThreadGroup(int n) : n_(n), slots_(n), sync_(n) {}
  class Member final : public RankExchange {
   public:
    Member(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
    int rank() const override { return rank_; }
    int world() const override { return g_.n_; }
    void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) override {
      if (rank_ == g_.fail_rank) throw std::runtime_error("connection closed by peer");
      g_.slots_[rank_].assign(mine.begin(), mine.end());
      g_.sync_.arrive_and_wait();
      for (int k = 0; k < g_.n_; ++k)
        std::memcpy(all.data() + k * mine.size(), g_.slots_[k].data(), mine.size());
      g_.sync_.arrive_and_wait();
      ++calls;
    }
    int calls = 0;

   private:
    ThreadGroup& g_;
    int rank_;
  };
  int fail_rank = -1;

 private:
  int n_;
  std::vector<std::vector<std::byte>> slots_;
  std::barrier<> sync_;
};

}  // namespace ckpt::test
