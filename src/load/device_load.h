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
// storages are zero chunks through the same slots; decoded ones (inflate, decrypt, legacy
// layouts) are decoded into host memory of their own size first, then copied through the slots.
// Staging memory is the one bound: 2 × threads × slot ≤ staging_bytes, whatever the model's size
// (threads are reduced when the budget is smaller than 2 MiB per reader).
//
// A failure (read, CRC, copy) stops every reader at its next chunk; the copies already queued are
// waited for before the staging and device memory are freed, and the first error is thrown.

#include <vector>

#include "device/copy_engine.h"
#include "load/plan.h"

namespace ckpt::internal {

struct DeviceLoadStats {
  uint64_t warmed_bytes = 0;   // read into the page cache while the device's engine started
  uint64_t direct_bytes = 0;   // read straight into device memory (GPUDirect Storage)
  int readers = 0;
  uint64_t slot_bytes = 0;
  uint64_t staging_bytes = 0;  // held during the load
  uint64_t device_bytes = 0;   // the allocation
};

// Returns the plan's storages (indexed like the model's; null where not planned), each on
// engine.device() (Storage::device; data is a device address): plan_tensors() makes the tensors.
// Throws Error like the other executors, kLimitExceeded when the device lacks the memory, kIo
// naming the device when a copy fails.
//
// With `direct` (LoadOptions::gds), a local file and an engine that reads files directly
// (CopyEngine::open_direct: cuFile), each raw chunk of a storage that needs no host work (no CRC
// to check, no byte swap) is read by its reader straight into its place in the device arena,
// without a staging slot; everything else, and everything when the engine cannot, goes through
// the ring as above.
std::vector<StoragePtr> execute_device(const LoadPlan& plan, CopyEngine& engine,
                                       uint64_t staging_bytes, bool direct = false,
                                       DeviceLoadStats* stats = nullptr);
// The same into `device`, whose engine (engine_for) may not exist yet: creating it (a CUDA
// context: hundreds of milliseconds) then overlaps reading. While it starts, the readers read the
// plan's first chunks, in the order the load takes them, from a local file into a small scratch
// buffer each (4 MiB), so that a cold page cache is filling meanwhile; the load then reads them
// again, from memory. Not done for other sources (it would transfer bytes twice).
std::vector<StoragePtr> execute_device(const LoadPlan& plan, const Device& device,
                                       uint64_t staging_bytes, bool direct = false,
                                       DeviceLoadStats* stats = nullptr);

}  // namespace ckpt::internal
