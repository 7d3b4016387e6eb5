#pragma once
// LoadPlan: which storages a load reads, where their bytes are, how they are decoded, verified
// and byte-swapped, and where they go — decided once, in make_plan(), and executed by every load
// path: eager (execute_eager), zero-copy views and single storages (load_one), streaming
// (execute_stream) and reads into caller buffers (Checkpoint::read_into through load_one).
//
// Layer: load reads the neutral model (model/checkpoint_model.h) and sources; it knows no format
// and no public class but the value types (Tensor, Storage).

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "ckpt/options.h"
#include "load/preload.h"
#include "model/checkpoint_model.h"
#include "util/progress.h"

namespace ckpt::internal {

// How one storage's bytes reach memory.
enum class Route : uint8_t {
  kZeros,   // meta storage: zeros
  kView,    // a view into the source's memory (mapped file): no copy
  kRead,    // raw bytes read from the copy source, CRC32 fused with the read when verifying
  kDecode,  // the model's StorageDecoder (inflate, decrypt, legacy layouts)
};

struct PlannedStorage {
  uint32_t storage = 0;  // index into the model's storages
  Route route = Route::kRead;
  bool byteswap = false;   // stored in the other byte order: swap after reading
  bool check_crc = false;  // verify the CRC32 the model stores for it (kView / kRead)
};

struct LoadPlan {
  const CheckpointModel* model = nullptr;
  SourcePtr copy;  // where kRead bytes come from (a mapping's pread twin, else the source)
  bool verify = false;
  bool drop_cache = false;  // LoadOptions::drop_cache
  int threads = 1;
  ProgressFn progress;  // LoadOptions::progress: bytes of the planned storages as they load
  std::vector<uint32_t> tensors;         // selected tensors, in table order
  std::vector<PlannedStorage> storages;  // their storages, raw ones first in file order

  static constexpr uint32_t kMaxItems = UINT32_MAX - 1;
};

using TensorFilter = std::function<bool(const TensorInfo&)>;

// The route of storage `s`: kZeros for meta, kView for raw bytes of a mapped source in native
// byte order when `allow_view` and not options.copy, kRead for other raw bytes, else kDecode.
Route route_of(const CheckpointModel& m, size_t s, const LoadOptions& options, bool allow_view);

// Plans the storages of the tensors `filter` accepts (all when empty). Throws
// Error{kLimitExceeded} past 2^32 - 1 tensors or storages.
LoadPlan make_plan(const CheckpointModel& m, SourcePtr copy, const LoadOptions& options,
                   const TensorFilter& filter, bool allow_view);
// A plan for one storage.
LoadPlan plan_storage(const CheckpointModel& m, SourcePtr copy, size_t s,
                      const LoadOptions& options, bool allow_view);

// Bytes of one planned storage into dst (exactly its nbytes; not for kView): zeros, raw bytes
// in 1 MiB pieces with their CRC32 while hot, or the decoder; then the byte swap. Throws Error
// (kCorrupt naming the record and tensors on a CRC mismatch).
void load_into(const LoadPlan& plan, const PlannedStorage& p, std::byte* dst);

// A Storage over `data`, kept alive by `owner`; `writable` when the caller may change the bytes.
StoragePtr make_storage(const StorageInfo& info, const std::byte* data,
                        std::shared_ptr<const void> owner, bool writable);

// Loads one planned storage: a view for kView (CRC checked when asked), else owned memory.
StoragePtr load_one(const LoadPlan& plan, const PlannedStorage& p);

// Eager: every planned storage into one huge-page arena (raw ones through a Preload: parallel
// positional reads, CRC fused), decoded and meta ones by the same threads. `started`, if given,
// is a Preload already reading `started_ranges` (ascending offsets): it is used when it covers
// every raw storage of the plan, else dropped. `placed`, if set, is called (on this thread) with
// the tensors once their addresses are fixed and the reader threads are running, before this
// thread joins them (LoadOptions::on_placed). Returns the plan's tensors.
using PlacedFn = std::function<void(const std::vector<Tensor>&)>;
std::vector<Tensor> execute_eager(const LoadPlan& plan, std::unique_ptr<Preload> started = {},
                                  const std::vector<ByteRange>& started_ranges = {},
                                  const PlacedFn& placed = {});

// Streaming: the planned storages in file order through a ring of `budget` bytes, each handed to
// `fn` with the selected tensors that view it, while reader threads fill the ring. Throws
// Error{kInvalidArgument} naming the tensor when one storage does not fit the budget.
void execute_stream(const LoadPlan& plan, uint64_t budget,
                    const std::function<void(const Tensor&)>& fn);
// Streaming in a caller's order: plan.storages[order[k]] for k = 0, 1, ... (a storage may come
// more than once) through a ring of `budget` bytes, each handed to fn(k, storage) on the calling
// thread while plan.threads readers fill the ring ahead; the storage's bytes are valid during
// the call only. Same errors as execute_stream.
using StorageFn = std::function<void(size_t k, const StoragePtr& storage)>;
void execute_stream_order(const LoadPlan& plan, uint64_t budget, std::span<const uint32_t> order,
                          const StorageFn& fn);

// Bytes the plan loads (every planned storage), the total its progress counts to.
uint64_t plan_bytes(const LoadPlan& plan);

// Tensors of the plan over `storages` (indexed by storage).
std::vector<Tensor> plan_tensors(const LoadPlan& plan, const std::vector<StoragePtr>& storages);

}  // namespace ckpt::internal
