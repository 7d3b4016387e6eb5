// Streaming execution of a LoadPlan under a memory budget: storages are placed in a ring of
// `budget` bytes in an order (file order for a streaming load, the writer's order for a streamed
// conversion) and handed to the caller's function in that order, while several readers fill the
// slots ahead of it.
//
// One thread (the placer) acquires the ring's slots in that order and queues each storage's
// fill; `plan.threads` readers (the placer among them when it has nothing to place) take the
// fills in order — a large raw storage as several 8 MiB pieces, so one storage is read by many
// threads too — and the placer commits the slots in order as their fills complete. The ring is
// the one bound on memory: the readers run ahead only as far as the free space allows.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "load/plan.h"
#include "load/ring_buffer.h"
#include "util/bytes.h"

namespace ckpt::internal {

void execute_stream_order(const LoadPlan& plan, uint64_t budget, std::span<const uint32_t> order,
                          const StorageFn& fn) {
  const CheckpointModel& d = *plan.model;
  for (uint32_t k : order) {
    const size_t s = plan.storages.at(k).storage;
    uint64_t need = RingBuffer::footprint(d.storages[s].nbytes);
    if (need > budget) {
      std::string tensor;
      for (const TensorInfo& t : d.tensors)
        if (t.storage == s) {
          tensor = t.name;
          break;
        }
      throw Error(ErrorCode::kInvalidArgument,
                  "storage of " + std::to_string(d.storages[s].nbytes) +
                      " bytes does not fit the streaming budget of " + std::to_string(budget) +
                      " bytes",
                  d.source->name(), tensor);
    }
  }
  if (order.empty()) return;

  RingBuffer ring(std::max<uint64_t>(budget, RingBuffer::kAlign));
  ProgressMeter meter(plan.progress, plan.progress ? plan_bytes(plan) : 0);
  const int readers = std::max(1, plan.threads);
  std::thread reader([&] {
    // A fill: the storage at position `k` of the order (or the bytes [off, off + len) of it)
    // into `dst`.
    struct Fill {
      size_t k;
      std::byte* dst;
      uint64_t off, len;
      bool whole;
    };
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Fill> fills;                       // queued, in plan order
    std::vector<uint32_t> left(order.size(), 0);  // pieces not yet done, per position
    size_t placed = 0;                            // storages placed so far (their slots acquired)
    bool ending = false;
    std::exception_ptr failure;
    auto run_one = [&](std::unique_lock<std::mutex>& lock) {
      Fill f = fills.front();
      fills.pop_front();
      lock.unlock();
      try {
        const PlannedStorage& p = plan.storages[order[f.k]];
        if (f.whole)
          load_into(plan, p, f.dst);
        else
          plan.copy->read_into(d.storages[p.storage].offset + f.off,
                               std::span<std::byte>(f.dst + f.off, f.len));
        if (meter.active()) meter.add(f.whole ? d.storages[p.storage].nbytes : f.len);
      } catch (...) {
        lock.lock();
        if (!failure) failure = std::current_exception();
        fills.clear();
        cv.notify_all();
        return;
      }
      lock.lock();
      --left[f.k];
      cv.notify_all();
    };
    auto worker = [&] {
      std::unique_lock<std::mutex> lock(mu);
      for (;;) {
        cv.wait(lock, [&] { return ending || failure || !fills.empty(); });
        if (fills.empty() || failure) return;
        run_one(lock);
      }
    };
    std::vector<std::thread> pool;
    try {
      for (int t = 1; t < readers; ++t) pool.emplace_back(worker);
      size_t committed = 0;
      // Commits, in order, the placed storages whose fills are done; with `wait`, waits for all.
      auto commit_done = [&](std::unique_lock<std::mutex>& lock, bool wait) {
        for (;;) {
          while (committed < placed && left[committed] == 0 && !failure) {
            ring.commit();
            ++committed;
          }
          if (failure) std::rethrow_exception(failure);
          if (!wait || committed == placed) return;
          if (!fills.empty())
            run_one(lock);  // help rather than wait
          else
            cv.wait(lock);
        }
      };
      for (size_t k = 0; k < order.size(); ++k) {
        const PlannedStorage& p = plan.storages[order[k]];
        const StorageInfo& si = d.storages[p.storage];
        std::optional<RingBuffer::Slot> slot = ring.try_acquire(si.nbytes, k);
        while (!slot) {
          // No room: commit what is done (the consumer may be waiting for it), help, retry.
          {
            std::unique_lock<std::mutex> lock(mu);
            commit_done(lock, false);
            if (!fills.empty())
              run_one(lock);
            else if (committed < placed)
              cv.wait_for(lock, std::chrono::milliseconds(1));
          }
          if (committed == placed)
            slot = ring.acquire(si.nbytes, k);  // nothing ahead: block
          else
            slot = ring.try_acquire(si.nbytes, k);
          if (!slot && committed == placed) break;
        }
        if (!slot) break;  // the consumer stopped
        std::unique_lock<std::mutex> lock(mu);
        constexpr uint64_t kPiece = 8 << 20;
        if (p.route == Route::kRead && !p.check_crc && !p.byteswap && si.nbytes > kPiece &&
            readers > 1) {
          for (uint64_t off = 0; off < si.nbytes; off += kPiece) {
            fills.push_back({k, slot->data, off, std::min(kPiece, si.nbytes - off), false});
            ++left[k];
          }
        } else {
          fills.push_back({k, slot->data, 0, si.nbytes, true});
          left[k] = 1;
        }
        ++placed;
        cv.notify_all();
        if (readers == 1)
          while (!fills.empty() && !failure) run_one(lock);  // the placer is the reader
        commit_done(lock, false);
      }
      {
        std::unique_lock<std::mutex> lock(mu);
        commit_done(lock, true);
        ending = true;
        cv.notify_all();
      }
      for (auto& t : pool) t.join();
      ring.close();
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ending = true;
        if (!failure) failure = std::current_exception();
        fills.clear();
        cv.notify_all();
      }
      for (auto& t : pool) t.join();
      ring.fail(failure);
    }
  });
  try {
    while (auto slot = ring.wait_ready()) {
      // Writable: the ring's bytes are this load's own until fn returns.
      const StorageInfo& si = d.storages[plan.storages[order[slot->tag]].storage];
      fn(slot->tag, make_storage(si, slot->data, ring.arena(), true));
      ring.release();
    }
  } catch (...) {
    ring.stop();
    reader.join();
    throw;
  }
  reader.join();
  ring.rethrow_if_failed();
  meter.finish();
}

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
  // The plan lists storages in file order, decoded ones last.
  std::vector<uint32_t> order(plan.storages.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<uint32_t>(k);
  execute_stream_order(plan, budget, order, [&](size_t k, const StoragePtr& st) {
    const size_t s = plan.storages[k].storage;
    for (uint32_t i = first[s]; i < first[s + 1]; ++i) fn(Tensor(d.tensors[members[i]], st));
  });
}

}  // namespace ckpt::internal
