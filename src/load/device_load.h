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

// Fills every target through the staging ring (above), with options.threads readers (as
// planned), options.staging_bytes of staging (within host_staging_budget()) and, with
// options.gds, direct reads (below). A raw storage's CRC is checked where a target covers all of
// it. Throws like the executors; on a throw every queued copy has completed.
// When every target is memory the host may write (CopyEngine::host_accessible: the engine's own
// allocations on a device that shares memory with the host) there is no ring and no copy: each
// reader reads its chunks straight into the targets (CRC and byte swap in place), decoded storages
// are decoded in place. With plan.drop_cache, each chunk's pages that were not cached when the load
// began (`dropper`'s record, made here when null) leave the page cache once read.
void fill_device(const LoadPlan& plan, CopyEngine& engine, const std::vector<DeviceTarget>& targets,
                 const LoadOptions& options, DeviceLoadStats* stats = nullptr,
                 const PageCacheDropper* dropper = nullptr);

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
// allocation per storage from it, each freed when its last tensor dies. The bytes needed are
// checked against options.max_device_bytes and the device's free memory first: a load that
// cannot fit allocates nothing and reads nothing (Error{kLimitExceeded}).
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
