#pragma once
// Memory of eager loads kept for the next one.
//
// An eager load fills one large buffer (an "arena", huge pages where the kernel allows). Fresh
// memory costs its first-touch page faults — on machines of this class about as much as the
// copy itself — so when the last tensor of a load is freed, its arena (if at least 64 MiB) is
// not unmapped but kept, lazily freed (madvise MADV_FREE: the kernel takes its pages back when
// it needs memory, without swapping), for the next load of a similar size (it is used when it
// is at most 25% larger than asked for). At most one arena is kept; a load that cannot use it
// unmaps it first, so a process never holds a kept arena beside a new one. This is what malloc
// does for small tensors (torch.load's storages come from its heap); it matters to processes
// that load again: evaluation loops, weight reloads, benchmarks.
//
// The default limit is half the machine's physical memory; the environment variable
// CKPT_KEEP_ARENA_MB overrides it at first use (0 turns keeping off).
//
// Process-wide state. Thread-safe: every function may be called from any thread, also while
// loads run (the kept arena is handed over under one lock; a load takes it or leaves it).

#include <cstdint>

namespace ckpt {

// The largest arena kept (bytes); 0: none is kept (a kept one is released now).
void set_kept_memory_limit(uint64_t max_bytes);
uint64_t kept_memory_limit();
// Unmaps the kept arena now, if any; returns its size in bytes (0: none was kept).
uint64_t release_kept_memory();
// The size of the arena kept now (0: none).
uint64_t kept_memory();

}  // namespace ckpt
