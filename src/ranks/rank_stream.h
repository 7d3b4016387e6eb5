#pragma once
// What the two halves of a rank load share: where its tensors go (host memory, or a device's
// through its copy engine), batched reads of raw bytes, and the Replicate tensors of a group
// load as one stream (rank_exchange.cc) that the group assembles round by round.

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "ckpt/rank_plan.h"
#include "device/copy_engine.h"

namespace ckpt::internal {

// The source of file `file` of `c` (Checkpoint::files() order).
const ByteSource& source_of(const Checkpoint& c, uint32_t file);

// Where a load's tensors go: host memory, or device memory through the device's copy engine.
struct RankTarget {
  Device device;                 // cpu, or the resolved CUDA device
  CopyEngine* engine = nullptr;  // null: host memory
  LoadOptions host;              // the load's options for reads into host memory
  static RankTarget of(const LoadOptions& options);
};

// Reads of raw bytes gathered per file and made together (one read_batch per file: a remote
// source runs them in parallel, as one window of ranged requests).
class Batches {
 public:
  explicit Batches(const Checkpoint& c) : c_(c) {}
  // Bytes [a, b) of rt's box into dst, where they lie raw in one range of a file.
  void add(const RankTensor& rt, uint64_t a, uint64_t b, std::byte* dst);
  // rt's whole box into dst: its ranges one after another.
  void add_box(const RankTensor& rt, std::byte* dst);
  void read();

 private:
  std::vector<ReadRequest>& of(uint32_t file);
  const Checkpoint& c_;
  std::vector<std::pair<uint32_t, std::vector<ReadRequest>>> files_;
};

// The Replicate tensors of a group load, each at its offset of one allocation (the stream).
struct Replicated {
  std::vector<const RankTensor*> tensors;
  std::vector<uint64_t> start;  // the stream offset of each, 256-byte aligned (the gaps between
                                // tensors are exchanged, never read)
  uint64_t total = 0;           // the stream's bytes
  void add(const RankTensor& rt);
};

// Assembles the stream at `stream` (host memory, or device memory of t's device) round by round
// of at most `budget` bytes: this rank reads its part of each round into place, and
// RankExchange::gather_parts fills the other ranks' parts. The reads run on a thread of their
// own, ahead of the collective: the parts in round order (round i's gather_parts, on the calling
// thread, waits for round i's part only, so later rounds are read while it runs), then `after`
// (the rank's other tensors), overlapping the rounds left. One read at a time: a device load
// holds one staging ring, as a sequential one does. The reader is joined on every path.
// Failures: a failed read of round i's part is rethrown as it was thrown, after rounds 0..i-1,
// without round i's collective (the other ranks see this rank missing from round i, as they would
// from a sequential load); a failure in `after` is rethrown after every round (the group
// completes); a failed exchange stops the reader and throws Error{kIo} naming this rank and the
// tensors of the round.
void exchange_replicated(const Checkpoint& c, const Replicated& r, RankExchange& ex,
                         uint64_t budget, const LoadOptions& o, std::byte* stream,
                         const RankTarget& t, const std::function<void()>& after);

}  // namespace ckpt::internal
