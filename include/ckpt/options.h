#pragma once
// Options for opening, loading and saving, and the limits that bound what a file may ask for.
// Plain values: copied where they are used, so a caller may reuse or change its own afterwards.

#include <cstdint>
#include <functional>
#include <string>

namespace ckpt {

// Every length, count and size read from a file is checked against these before anything is
// allocated. Defaults fit real models (a 1 TB checkpoint with 1M tensors opens); an error that
// hits one names the field to raise.
struct Limits {
  uint64_t max_metadata_bytes = 1ull << 30;  // data.pkl, safetensors header, tensorizer index...
  uint64_t max_tensors = 16ull << 20;        // tensors (and storages, records) per file
  uint32_t max_dims = 64;                    // dimensions per tensor
  uint64_t max_pickle_memo = 64ull << 20;    // memo entries
  uint64_t max_pickle_stack = 64ull << 20;   // stack + mark depth
  uint32_t max_pickle_depth = 1000;          // nesting when converting/printing trees
  uint64_t max_inflated_bytes = 4ull << 30;  // one deflated record's inflated size
  uint64_t max_records = 16ull << 20;        // zip entries
};

struct OpenOptions {
  bool mmap = true;  // map the file (zero-copy views); false: pread into owned memory
  Limits limits;
  // torch pickles: refuse classes ckpt does not know (Error{kUnsupported} naming the global), as
  // torch.load(weights_only=True) does. Off: they are kept as opaque objects (Value::foreign),
  // never called either way.
  bool strict = false;
  // tensorizer decryption (issue 4): a raw 32-byte key, or a password.
  std::string decrypt_key;
  std::string decrypt_password;
};

// Progress of a long operation: `done` of `total` bytes. Called at most once per ~100 ms (never
// for an operation quicker than that) and once at the end with done == total; `done` never goes
// back. Loads call it from their reader threads, never from two at once: keep it quick, and it
// must not throw.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

struct LoadOptions {
  bool verify = false;  // check CRC32 (fused with the read); mismatch throws Error{kCorrupt}
  int threads = 0;      // reader threads; 0 = pick for the machine
  bool copy = false;    // with an mmap source: copy into owned memory instead of views
  // Bytes of the loaded storages (load_all, open_and_load, stream; Checkpoint::verify(progress)
  // counts the bytes it checks). Not called for zero-copy views, which read nothing.
  ProgressFn progress;
};

struct SaveOptions {
  uint32_t alignment = 64;   // torch zip: payload alignment (power of two < 65536)
  bool atomic = true;        // temporary file + rename
  bool fsync = true;
  std::string archive_name;  // torch zip folder name; empty = derived from the file name
};

}  // namespace ckpt
