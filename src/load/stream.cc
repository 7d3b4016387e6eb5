// Streaming execution of a LoadPlan under a memory budget: a reader thread fills a ring of
// `budget` bytes storage by storage (file order) while the caller's function consumes them.

#include <algorithm>
#include <thread>

#include "load/plan.h"
#include "load/ring_buffer.h"
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
    uint64_t need = RingBuffer::footprint(d.storages[s].nbytes);
    if (need > budget)
      throw Error(ErrorCode::kInvalidArgument,
                  "storage of " + std::to_string(d.storages[s].nbytes) +
                      " bytes does not fit the streaming budget of " + std::to_string(budget) +
                      " bytes",
                  d.source->name(), d.tensors[tensors_of(s)[0]].name);
  }
  if (plan.storages.empty()) return;

  RingBuffer ring(std::max<uint64_t>(budget, RingBuffer::kAlign));
  ProgressMeter meter(plan.progress, plan.progress ? plan_bytes(plan) : 0);
  std::thread reader([&] {
    try {
      for (const PlannedStorage& p : plan.storages) {
        auto slot = ring.acquire(d.storages[p.storage].nbytes, p.storage);
        if (!slot) return;  // the consumer stopped
        load_into(plan, p, slot->data);
        if (meter.active()) meter.add(d.storages[p.storage].nbytes);
        ring.commit();
      }
      ring.close();
    } catch (...) {
      ring.fail(std::current_exception());
    }
  });
  try {
    while (auto slot = ring.wait_ready()) {
      // Writable: the ring's bytes are this load's own until fn returns.
      StoragePtr st = make_storage(d.storages[slot->tag], slot->data, ring.arena(), true);
      for (uint32_t i : tensors_of(slot->tag)) fn(Tensor(d.tensors[i], st));
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

}  // namespace ckpt::internal
