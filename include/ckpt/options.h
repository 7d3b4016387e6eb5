#pragma once
// Options for opening, loading and saving, and the limits that bound what a file may ask for.
// Plain values: copied where they are used, so a caller may reuse or change its own afterwards.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ckpt/device.h"

namespace ckpt {

class Checkpoint;
class Tensor;

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
  // Memory the metadata of one file may make: a pickle's objects (and the tree made of them) and
  // an inflated data.pkl may take max_object_bytes, plus object_bytes_per_byte for each byte of
  // the file (object_bytes_for()). A small file cannot ask for gigabytes; a large checkpoint
  // gets room in proportion.
  uint64_t max_object_bytes = 256ull << 20;
  uint64_t object_bytes_per_byte = 256;
  // max_object_bytes + object_bytes_per_byte * file_size, saturating at UINT64_MAX.
  uint64_t object_bytes_for(uint64_t file_size) const noexcept {
    if (object_bytes_per_byte != 0 &&
        file_size > (UINT64_MAX - max_object_bytes) / object_bytes_per_byte)
      return UINT64_MAX;
    return max_object_bytes + object_bytes_per_byte * file_size;
  }
};

// Reading (and, for S3, writing) objects named by URL: http://, https://, s3://bucket/key
// (include/ckpt/remote.h). Plain values; the defaults were measured on loopback
// (docs/benchmarks.md).
struct RemoteOptions {
  int connections = 8;                // ranged GETs in flight per read (and parts per upload)
  uint64_t chunk_size = 16ull << 20;  // bytes per ranged GET (and per multipart part, >= 5 MiB)
  double connect_timeout_s = 10;      // TCP + TLS connect
  // A transfer slower than low_speed_bytes per second for low_speed_time_s is abandoned (and
  // retried): a stalled socket never hangs a load.
  uint64_t low_speed_bytes = 1024;
  double low_speed_time_s = 15;
  // Retries of one range (5xx, 408, 429, resets, cut bodies; a cut range resumes from the byte it
  // reached), with full-jitter exponential backoff from retry_base_s, capped at retry_max_s
  // (a Retry-After header is honoured up to that cap), all within timeout_s per range.
  int retries = 6;
  double retry_base_s = 0.1;
  double retry_max_s = 10;
  // The most one range may take (at least 1 s), counted from its first request, retries
  // included, and enforced during a transfer too: a server that trickles or never ends a body
  // fails with Error{kIo} ("timed out") when it runs out.
  double timeout_s = 300;
  // S3. Empty fields come from the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
  // AWS_SESSION_TOKEN, AWS_REGION / AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL,
  // AWS_PROFILE with ~/.aws/credentials and ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE,
  // AWS_CONFIG_FILE). No credentials anywhere, or `unsigned_requests`: anonymous requests.
  std::string endpoint;  // e.g. http://127.0.0.1:7480 (path-style addressing)
  std::string region;
  std::string access_key_id, secret_access_key, session_token;
  std::string profile;
  bool unsigned_requests = false;
  // HTTPS: a PEM file of certificate authorities to trust instead of the system's (a private CA,
  // a self-signed endpoint). Empty: AWS_CA_BUNDLE, CURL_CA_BUNDLE or SSL_CERT_FILE from the
  // environment, in that order, else the system store. Certificates are always verified.
  std::string ca_file;
  // A server that ignores Range requests (python's http.server) answers the first range with the
  // whole object. An object of at most 1 MiB is kept as that answer. A larger one is refused
  // (Error{kIo}), unless `download_whole`: then that answer is read to its end (one streaming
  // GET, within timeout_s) into an unlinked temporary file under TMPDIR (else /tmp), and every
  // read is served from the file's mapping. For loads and conversions; it needs the object's
  // size in free space there.
  bool download_whole = false;
  // Called with a sentence for the user about how a path or URL is read: the object cannot be
  // pinned (the server sends neither ETag nor Last-Modified, so only its length shows a change),
  // it is downloaded whole (above), or a model folder holds several checkpoints and one was
  // taken (Checkpoint::open). Null: no notes. Called on the thread that opens the path.
  std::function<void(const std::string&)> on_note;
};

struct OpenOptions {
  bool mmap = true;  // map the file (zero-copy views); false: pread into owned memory
  // With mmap, a local file (a single file, or a shard index itself) is mapped privately
  // copy-on-write and its views are writable (open_mmap_source(path, true); Storage::writable):
  // a write copies the page for this process only. Shards, a folder's data files and URLs are
  // read as without it.
  bool writable_views = false;
  // For a path that is a URL (http://, https://, s3://): how to reach it. `mmap` is ignored there.
  RemoteOptions remote;
  Limits limits;
  // torch pickles: refuse classes ckpt does not know (Error{kUnsupported} naming the global), as
  // torch.load(weights_only=True) does. Off: they are kept as opaque objects (Value::foreign),
  // never called either way.
  bool strict = false;
  // tensorizer decryption: a raw 32-byte key, or a password.
  std::string decrypt_key;
  std::string decrypt_password;
};

// Progress of a long operation: `done` of `total` bytes. Called at most once per ~100 ms (never
// for an operation quicker than that) and once at the end with done == total; `done` never goes
// back. Loads call it from their reader threads, never from two at once: keep it quick, and it
// must not throw.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

// The pace of a progress display fed by a ProgressFn (the CLI's progress line, the Python
// module's callback): due() says whether a report is shown, and holds the turn while it is.
// A report is shown at most every `every`, none before `delay` from construction (then a quick
// operation shows nothing, its last report included), and the last report (`last`: done ==
// total) always, once: a last report equal to the last one shown is not shown again until
// restart(). Thread-safe: a report that finds another being shown is dropped, except a last
// one, which waits for its turn.
class ProgressThrottle {
 public:
  explicit ProgressThrottle(
      std::chrono::steady_clock::duration every = std::chrono::milliseconds(100),
      std::chrono::steady_clock::duration delay = {});
  // An owning lock when the report is to be shown (show it while holding it), else an empty one.
  std::unique_lock<std::mutex> due(uint64_t done, uint64_t total, bool last);
  // A new phase: its last report is shown even when equal to the previous phase's.
  void restart();

 private:
  const std::chrono::steady_clock::duration every_, delay_;
  const std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point shown_at_;
  bool shown_ = false, last_shown_ = false;
  uint64_t last_done_ = 0, last_total_ = 0;
  std::mutex mu_;
};

struct LoadOptions {
  bool verify = false;  // check CRC32 (fused with the read); mismatch throws Error{kCorrupt}
  // Where load_all(), open_and_load(), storage() and tensor() put the bytes. A CUDA device:
  // reader threads fill a ring of pinned staging buffers (staging_bytes in all) that are copied
  // to one device allocation per load, with the tensors as views of it (Storage::device). Throws
  // Error{kUnsupported} naming what is missing where CUDA cannot be used (no runtime library, no
  // such device: include/ckpt/device.h). stream() and read_into() are host-only (kUnsupported).
  Device device;
  // Host staging: pinned memory, also capped at half of what the cgroup memory limit leaves
  // (/sys/fs/cgroup/memory.max) when there is one. 64 MiB: on an H100 machine, smaller rings stay
  // in the CPU's cache and pin faster on a process's first load (docs/benchmarks/gpu.md).
  uint64_t staging_bytes = 64ull << 20;
  // Device memory (a CUDA device): the load's bytes are checked against max_device_bytes (0: no
  // limit of its own) and the device's free memory (cudaMemGetInfo) before anything is
  // allocated or read; a load that cannot fit throws Error{kLimitExceeded} naming the bytes
  // needed and the bytes free. Where the bytes go: one allocation for the whole load (the
  // tensors are views of it; it is freed with the last of them), or with `allocator` one
  // allocation per storage from it, each freed when its own tensors die (caller-owned memory:
  // load_into() in include/ckpt/load_into.h). Meta tensors get no bytes (a null address).
  uint64_t max_device_bytes = 0;
  std::shared_ptr<DeviceAllocator> allocator;
  // A CUDA device and a local file: read raw storages straight from the file into device memory
  // with GPUDirect Storage (NVIDIA's cuFile library, loaded at run time), where the library and
  // its driver open (gds_unavailable() in include/ckpt/device.h says why not). Storages that
  // need host work (verify's CRC32, byte swapping, decoding, meta zeros), other sources, and
  // every storage where GDS is unavailable go through the pinned staging ring as without it:
  // the result is the same.
  bool gds = false;
  int threads = 0;    // reader threads; 0 = pick for the machine
  bool copy = false;  // with an mmap source: copy into owned memory instead of views
  // A local file read by an eager or device load: once a range's bytes are consumed (in the
  // load's memory, or copied on from staging), its pages that were not in the page cache when
  // the load began are dropped from it (posix_fadvise POSIX_FADV_DONTNEED), so a cold load
  // leaves the page cache as it found it and the file is not held twice in memory. Pages that
  // were cached before (another process's warm cache) stay. Views of a mapping and other
  // sources are not affected.
  bool drop_cache = false;
  // Bytes of the loaded storages (load_all, open_and_load, stream; Checkpoint::verify(progress)
  // counts the bytes it checks). Not called for zero-copy views, which read nothing. For a set
  // of files, one count over all of them: the total is the sum of the files' totals.
  ProgressFn progress;
  // Eager loads (load_all, open_and_load), of every kind of checkpoint: called once, on the
  // calling thread, when every tensor the load will return has its storage's final address
  // while reader threads may still be filling the bytes, with the checkpoint and those tensors.
  // (A set loads file after file: the call comes while its last file is read, the files
  // before it being loaded already.)
  // For a caller that builds its own objects over the memory meanwhile (the Python module makes
  // its torch tensors there, overlapping them with the reads). It must not read the bytes, nor
  // let anything made over them out, before the load returns; if the load then throws, drop
  // what it made. An exception it throws fails the load.
  std::function<void(const Checkpoint&, const std::vector<Tensor>&)> on_placed;
};

// What to do with a meta tensor (dtype and shape, no bytes: StorageInfo::meta) when the target
// has no meta tensors (safetensors; `ckpt extract`'s .npy files). pt and tensorizer keep meta
// tensors as meta tensors whatever this says.
enum class MetaTensors {
  kRefuse,  // Error{kUnsupported} naming the tensor (the default: no invented bytes)
  kZeros,   // write zeros of its dtype and shape
  kSkip,    // leave it out (ConvertReport::meta_skipped names it)
};

// The options of writing a torch.save zip (.pt .pth .bin .ckpt): save_torch (include/ckpt/
// torch.h) takes them, and convert() as its target (ConvertTarget, include/ckpt/convert.h).
// Each format has one such type (SafetensorsSaveOptions, TensorizerSaveOptions,
// DcpSaveOptions); atomic and fsync are the save_* path overloads' (convert() commits its
// output as ConvertOptions::atomic and ::fsync say).
struct TorchSaveOptions {
  uint32_t alignment = 64;  // payload alignment (a power of two below 64 KiB; 0 = 64)
  bool atomic = true;       // temporary file + rename
  bool fsync = true;
  // The zip's folder name. Empty: the output file name up to its first dot (as torch.save);
  // "archive" for a sink.
  std::string archive_name;
};
using SaveOptions = TorchSaveOptions;

}  // namespace ckpt
