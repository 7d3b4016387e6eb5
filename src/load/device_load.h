#pragma once
// Device loads: a LoadPlan executed into the memory of a device (a CopyEngine's), through a
// bounded ring of host staging slots.
//
//   reader threads ──pread──► staging slot (pinned) ──copy on lane slot%lanes──► device arena
//                   CRC32 per 1 MiB while hot, byte swap
//
// Every planned storage gets its place in one device allocation (256-byte aligned), and tensors
// are views of it. Raw storages are cut into slot-sized chunks taken by `threads` readers in
// file order; each reader owns two slots and alternates between them, so its next read overlaps
// its last copy, and a slot is reused only after the engine reports its copy done. Meta
// storages get no bytes; decoded ones (inflate, decrypt, legacy
// layouts) are decoded into host memory of their own size first, then copied through the slots.
// Staging memory is the one bound: 2 × threads × slot ≤ staging_bytes, whatever the model's size
// (threads are reduced when the budget is smaller than 2 MiB per reader).
//
// A failure (read, CRC, copy) stops every reader at its next chunk; the copies already queued are
// waited for before the staging and device memory are freed, and the first error is thrown.

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "device/copy_engine.h"
#include "io/page_cache.h"
#include "load/plan.h"

namespace ckpt::internal {

struct DeviceLoadStats {
  uint64_t warmed_bytes = 0;  // read into the page cache while the device's engine started
  uint64_t direct_bytes = 0;  // read straight into device memory (GPUDirect Storage)
  int readers = 0;
  uint64_t slot_bytes = 0;
  uint64_t staging_bytes = 0;  // held during the load
  uint64_t device_bytes = 0;   // the allocation
  // How the bytes reached the device: "staged" (pinned ring and copies), "unified" (read
  // straight into memory the host and the device share: CopyEngine::unified), "gds" (some read
  // with GPUDirect Storage).
  const char* path = "staged";
};

// One destination of a device load: bytes [from, from + len) of the planned storage
// plan.storages[k] go to device address `dst`.
struct DeviceTarget {
  size_t k = 0;
  uint64_t from = 0, len = 0;
  std::byte* dst = nullptr;
};

// The addresses of fill_device's targets, made while it reads: the maker sets targets[j].dst in
// target order and publishes how many are set; a reader reads its chunk into staging first and
// waits only for its own target's address before it queues the copy.
class TargetFeed {
 public:
  // Targets [0, count) have their addresses (count only grows).
  void publish(size_t count);
  // No more will be published: the maker is done or failed, or a reader failed.
  void close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  // Blocks until target `j` has its address (true) or the feed is closed without it (false).
  bool wait(size_t j);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<size_t> ready_{0};
  std::atomic<bool> closed_{false};
};
// Makes the targets' addresses, publishing them to the feed; stops early once it is closed.
using TargetMaker = std::function<void(TargetFeed&)>;

// Whether a device load overlaps its set-up with its first reads (the default): its device
// memory is made while the first storages are read, and each reader makes its own staging
// buffers. CKPT_DEVICE_OVERLAP=0 in the environment makes everything before the first read (for
// comparison: bench/device.py).
bool device_overlap();

// Fills every target through the staging ring (above), with options.threads readers (as
// planned), options.staging_bytes of staging (within host_staging_budget()) and, with
// options.gds, direct reads (below). A raw storage's CRC is checked where a target covers all of
// it. Throws like the executors; on a throw every queued copy has completed.
// When every target is memory the host may write (CopyEngine::host_accessible: the engine's own
// allocations on a device that shares memory with the host) there is no ring and no copy: each
// reader reads its chunks straight into the targets (CRC and byte swap in place), decoded storages
// are decoded in place. With plan.drop_cache, each chunk's pages that were not cached when the load
// began (`dropper`'s record, made here when null) leave the page cache once read.
// Each reader takes its two staging slots from the engine when it starts (engine.staging), so the
// first read waits for one reader's buffer, not the whole ring's.
// With `make`, the targets have no addresses yet: `make` runs on the calling thread while every
// reader runs on a thread of its own (reading into staging, each copy waiting for its target's
// address); a throw from it stops the load like a failed read, and a failed read closes the feed
// so that it stops making. Without device_overlap(), or on a unified engine (whose reads go into
// place), `make` runs before the first read.
void fill_device(const LoadPlan& plan, CopyEngine& engine, const std::vector<DeviceTarget>& targets,
                 const LoadOptions& options, DeviceLoadStats* stats = nullptr,
                 const PageCacheDropper* dropper = nullptr, const TargetMaker& make = {});

// The device memory of a load's planned storages (device_targets.cc): one target per planned
// storage (all of it; none of a meta storage's bytes), in one arena for the load, or with
// options.allocator one allocation per storage from it, each freed when its last owner dies.
class DeviceMemory {
 public:
  DeviceMemory(const LoadPlan& plan, const LoadOptions& options);
  // The bytes it takes on the device (for check_device_budget).
  uint64_t bytes() const { return allocator_ ? need_ : total_; }
  std::vector<DeviceTarget>& targets() { return targets_; }
  // Allocates in plan order, publishing the targets to `feed` as their memory exists: the arena
  // in one call; the allocator's in batches of 1, 2, 4, ... storages (one allocate_all call
  // each; one call without device_overlap()), until all are made or the feed is closed. Throws what
  // the allocator throws, or Error{kLimitExceeded} naming the storage and the bytes needed and free
  // where it gives none; what was allocated is freed with this object.
  void allocate(CopyEngine& engine, TargetFeed& feed);
  // What keeps target k's memory alive (the arena, or its own allocation).
  std::shared_ptr<const void> owner(size_t k) const;

 private:
  void allocate_batch(const Device& device, std::span<const size_t> which, CopyEngine& engine);

  const LoadPlan& plan_;
  std::shared_ptr<DeviceAllocator> allocator_;
  std::vector<DeviceTarget> targets_;
  std::vector<uint64_t> offsets_;  // in the arena
  uint64_t total_ = 0, need_ = 0;
  std::shared_ptr<std::byte> arena_;
  std::vector<std::shared_ptr<std::byte>> owners_;  // per target, with an allocator
};

// Pinned staging within the host's budget: `asked`, at most half of what the cgroup memory
// limit (/sys/fs/cgroup/memory.max, less memory.current) leaves, at least 2 MiB.
uint64_t host_staging_budget(uint64_t asked);

// Throws Error{kLimitExceeded} naming the bytes needed and the bytes free when `need` bytes do
// not fit options.max_device_bytes or the engine's free memory (before anything is allocated).
void check_device_budget(CopyEngine& engine, uint64_t need, const LoadOptions& options,
                         const std::string& file);

// Returns the plan's storages (indexed like the model's; null where not planned), each on
// engine.device() (Storage::device; data is a device address, null for a meta storage, which
// gets no bytes): plan_tensors() makes the tensors. Where the bytes go: one allocation of the
// engine for the whole load (the tensors are views of it), or with options.allocator one
// allocation per storage from it, each freed when its last tensor dies (DeviceMemory, made on
// the calling thread while the first storages are read: fill_device's `make`). The bytes needed
// are checked against options.max_device_bytes and the device's free memory first: a load that
// cannot fit allocates nothing and reads nothing (Error{kLimitExceeded}). An allocation that
// fails midway stops the load: nothing more is allocated, no copy is queued to a storage without
// memory, the queued ones complete, and everything allocated is freed before the error is thrown.
// Throws Error like the other executors, kLimitExceeded when the device lacks the memory, kIo
// naming the device when a copy fails.
//
// With options.gds, a local file (opened again with O_DIRECT where its filesystem allows) and an
// engine that reads files directly (CopyEngine::open_direct: cuFile), each raw chunk of a storage
// that needs no host work (no CRC to check, no byte swap) is read by its reader straight into its
// place in the device arena, without a staging slot; everything else, and everything when the
// engine cannot, goes through the ring as above. A direct read that fails is done again through the
// ring, and so is the rest of the load; DeviceLoadStats::direct_bytes and gds_bytes_read() count
// what really went direct.
std::vector<StoragePtr> execute_device(const LoadPlan& plan, CopyEngine& engine,
                                       const LoadOptions& options, DeviceLoadStats* stats = nullptr,
                                       const PageCacheDropper* dropper = nullptr);
// The same into `device`, whose engine (engine_for) may not exist yet: creating it (a CUDA
// context: hundreds of milliseconds) then overlaps reading. While it starts, the readers read the
// plan's first chunks, in the order the load takes them, from a local file into a small scratch
// buffer each (4 MiB), so that a cold page cache is filling meanwhile; the load then reads them
// again, from memory. Not done for other sources (it would transfer bytes twice).
std::vector<StoragePtr> execute_device(const LoadPlan& plan, const Device& device,
                                       const LoadOptions& options,
                                       DeviceLoadStats* stats = nullptr);

// One run of a device load of byte ranges: `len` bytes to device address `dst`, read from
// `source` at `offset`, or copied from host memory `host` (source null).
struct DeviceRun {
  const ByteSource* source = nullptr;
  uint64_t offset = 0;
  const std::byte* host = nullptr;
  uint64_t len = 0;
  std::byte* dst = nullptr;
};

// Fills every run through a ring of pinned staging slots, as fill_device does for storages (two
// slots per reader, options.staging_bytes within host_staging_budget(), at most options.threads
// readers): runs whose destinations follow one another (the row runs of a box) are packed into
// one slot, read with one read_batch per source and copied on with one copy; a run longer than
// a slot is cut, so that no run is ever whole in host memory unless it fits a slot. Throws the
// first failure once every queued copy is done. (The device path of a rank load: src/ranks.)
void fill_device_runs(CopyEngine& engine, std::span<const DeviceRun> runs,
                      const LoadOptions& options, DeviceLoadStats* stats = nullptr);

}  // namespace ckpt::internal
