// Streaming execution of a LoadPlan under a memory budget: a reader thread fills a ring of
// `budget` bytes storage by storage (file order) while the caller's function consumes them.

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "load/plan.h"
#include "util/arena.h"
#include "util/bytes.h"

namespace ckpt::internal {

void execute_stream(const LoadPlan& plan, uint64_t budget,
                    const std::function<void(const Tensor&)>& fn) {
  const CheckpointModel& d = *plan.model;
  // The selected tensors of each storage, as one array (first[s], first[s + 1]) into `members`:
  // a vector per storage would cost an allocation per storage, inside the memory budget.
  const size_t ns = d.storages.size();
  std::vector<uint32_t> first(ns + 1, 0);
  for (uint32_t i : plan.tensors) ++first[d.tensors[i].storage + 1];
  for (size_t s = 0; s < ns; ++s) first[s + 1] += first[s];
  std::vector<uint32_t> members(first[ns]);
  {
    std::vector<uint32_t> fill(first.begin(), first.end() - 1);
    for (uint32_t i : plan.tensors) members[fill[d.tensors[i].storage]++] = i;
  }
  auto tensors_of = [&](size_t s) {
    return std::span<const uint32_t>(members.data() + first[s], first[s + 1] - first[s]);
  };
  // The plan lists storages in file order, decoded ones last.
  for (const PlannedStorage& p : plan.storages) {
    const size_t s = p.storage;
    uint64_t need = align_up(d.storages[s].nbytes, 64);
    if (need > budget)
      throw Error(ErrorCode::kInvalidArgument,
                  "storage of " + std::to_string(d.storages[s].nbytes) +
                      " bytes does not fit the streaming budget of " + std::to_string(budget) +
                      " bytes",
                  d.source->name(), d.tensors[tensors_of(s)[0]].name);
  }
  if (plan.storages.empty()) return;
  auto ring = allocate_arena(std::max<uint64_t>(budget, 64));

  struct Slot {
    size_t storage;
    uint64_t off, len;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Slot> in_flight;  // FIFO of ring allocations, oldest first
  size_t ready = 0;            // slots at the front of in_flight that hold loaded bytes
  bool stop = false;
  std::exception_ptr failure;

  std::thread reader([&] {
    try {
      for (const PlannedStorage& p : plan.storages) {
        const size_t s = p.storage;
        uint64_t len = align_up(d.storages[s].nbytes, 64);
        uint64_t off = 0;
        {
          std::unique_lock<std::mutex> lock(mu);
          // First fit after the newest allocation, wrapping to the start of the ring.
          cv.wait(lock, [&] {
            if (stop) return true;
            if (in_flight.empty()) {
              off = 0;
              return true;
            }
            uint64_t tail = in_flight.front().off;
            uint64_t head = in_flight.back().off + in_flight.back().len;
            if (head > tail) {
              if (head + len <= budget) {
                off = head;
                return true;
              }
              if (len <= tail) {
                off = 0;
                return true;
              }
              return false;
            }
            if (head + len <= tail) {
              off = head;
              return true;
            }
            return false;
          });
          if (stop) return;
          in_flight.push_back({s, off, len});
        }
        load_into(plan, p, ring.get() + off);
        {
          std::lock_guard<std::mutex> lock(mu);
          ++ready;
        }
        cv.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      failure = std::current_exception();
      stop = true;
      cv.notify_all();
    }
  });

  auto finish = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    reader.join();
  };
  try {
    for (size_t n = 0; n < plan.storages.size(); ++n) {
      Slot slot;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return ready > 0 || failure; });
        if (failure) break;
        slot = in_flight.front();
      }
      // Writable: the ring's bytes are this load's own until fn returns.
      StoragePtr st = make_storage(d.storages[slot.storage], ring.get() + slot.off, ring, true);
      for (uint32_t i : tensors_of(slot.storage)) fn(Tensor(d.tensors[i], st));
      {
        std::lock_guard<std::mutex> lock(mu);
        in_flight.pop_front();
        --ready;
      }
      cv.notify_all();
    }
  } catch (...) {
    finish();
    throw;
  }
  finish();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace ckpt::internal
