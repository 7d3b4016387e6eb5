#pragma once
// Loading across ranks: which part of each tensor a rank of a group holds (a RankPlan), what
// that part costs to read (resolve), and the loads that read only this rank's bytes
// (load_rank) or, for tensors every rank holds whole, read every byte from storage once across
// the group and assemble the rest through the caller's collective (load_group, RankExchange),
// into host memory or straight into a device's (LoadOptions::device).
// The library runs no collective itself and links no NCCL or MPI: the caller implements
// RankExchange (the Python module does, over torch.distributed).

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/device.h"
#include "ckpt/options.h"
#include "ckpt/tensor.h"

namespace ckpt {

// How a rank holds one tensor.
struct Placement {
  enum class Kind : uint8_t {
    kReplicate,  // the whole tensor on every rank
    kShard,      // rank r of n: its contiguous part along `dim`, split as torch.chunk / DTensor
                 // Shard do (parts of ceil(size / n); the last ranks' may be short or empty)
    kBox,        // [begin[d], end[d]) per dimension, the same on every rank
  };
  Kind kind = Kind::kReplicate;
  int dim = 0;                      // kShard; negative counts from the last dimension
  std::vector<int64_t> begin, end;  // kBox

  static Placement replicate() { return {}; }
  static Placement shard(int dim) { return {Kind::kShard, dim, {}, {}}; }
  static Placement box(std::vector<int64_t> begin, std::vector<int64_t> end) {
    return {Kind::kBox, 0, std::move(begin), std::move(end)};
  }
  // "replicate", "shard:DIM" or "box:[b0,e0)x[b1,e1)..." (parse takes the first two).
  std::string str() const;
  // Throws Error{kInvalidArgument} for any other text.
  static Placement parse(std::string_view text);
};

// The rows [begin, end) along a dimension of `size` that rank `rank` of `world` holds under
// Shard: torch.chunk's split (DTensor's Shard._split_tensor without padding).
std::pair<int64_t, int64_t> shard_range(int64_t size, int rank, int world);

// Tensor name -> Placement: rules tried in the order added, first match wins; a name no rule
// matches gets the default (Replicate unless changed; none: such a tensor is refused).
class RankPlan {
 public:
  enum class Match : uint8_t {
    kExact,  // the whole name
    kGlob,   // fnmatch: * ? [...] ('*' matches dots too)
    kRegex,  // ECMAScript, matching the whole name
  };
  RankPlan& add(std::string pattern, Placement placement, Match match = Match::kGlob);
  // Throws Error{kInvalidArgument} for a regex that does not compile.
  RankPlan& set_default(std::optional<Placement> placement);
  // The placement of `name`, or nullopt where no rule matches and there is no default.
  std::optional<Placement> placement_of(std::string_view name) const;

  // A JSON object: either {pattern: placement, ...} or {"tensors": {pattern: placement, ...},
  // "default": placement or null}. A pattern is a glob, or "re:REGEX"; a placement is
  // "replicate", "shard:DIM" or {"begin": [...], "end": [...]}. Throws Error{kInvalidArgument}
  // naming `name` and the entry.
  static RankPlan from_json(std::string_view text, const std::string& name = "<plan>");

 private:
  struct Rule;
  std::vector<std::shared_ptr<const Rule>> rules_;
  std::optional<Placement> default_ = Placement::replicate();
};

// A byte range in one of the checkpoint's files (Checkpoint::files()).
struct FileRange {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// One tensor as this rank holds it.
struct RankTensor {
  size_t tensor = 0;  // index into Checkpoint::tensors()
  Placement placement;
  std::vector<int64_t> begin, end;  // the box this rank holds (whole for Replicate)
  uint64_t nbytes = 0;              // the box's bytes
  // The bytes read_slice reads for the box: exactly these where the tensor's storage is raw
  // (`exact`), fewest ranges (rows along dim 0: one). Not exact where the bytes are decoded or
  // assembled from several records (compressed, encrypted, byte-swapped, a DCP folder): then
  // empty, and the box's bytes are counted.
  std::vector<FileRange> ranges;
  bool exact = false;

  std::vector<int64_t> shape() const;
};

// A plan resolved against one checkpoint for one rank.
struct RankLoadPlan {
  int rank = 0, world = 1;
  std::vector<RankTensor> tensors;  // in Checkpoint::tensors() order
  // Bytes this rank reads with load_rank (ranges where exact, else the boxes' bytes).
  uint64_t read_bytes() const;
};

// Resolves `plan` for rank `rank` of `world` against `checkpoint`: every tensor's box and byte
// ranges, before any tensor byte moves. Throws Error{kInvalidArgument} naming the tensor when
// no rule covers it (no default), when Shard's dimension is not one of the tensor's, or a box
// is not inside it; and for rank outside [0, world).
RankLoadPlan resolve(const Checkpoint& checkpoint, const RankPlan& plan, int rank, int world);

// The tensors of `plan` (resolved against `checkpoint`), each its box in owned, contiguous
// memory, named as in the checkpoint, in plan order: every tensor read with
// Checkpoint::read_slice, so a rank reads only its part's bytes where the layout allows.
// Throws what read_slice throws.
//
// With options.device a CUDA device the tensors are in its memory (one allocation of the device,
// or one per tensor from options.allocator; Storage::device names it): the byte ranges of a raw
// box are read into the pinned staging ring of a device load (options.staging_bytes, .threads)
// and copied on by the device's copy engine, a box's row runs packed into one slot, so that no
// box is ever whole in host memory; other layouts are read into host memory one box at a time,
// then copied the same way. The budget is checked before anything is allocated or read
// (Error{kLimitExceeded}); a failed copy is Error{kIo}.
std::vector<Tensor> load_rank(const Checkpoint& checkpoint, const RankLoadPlan& plan,
                              const LoadOptions& options = {});

// A group's collective, implemented by the caller (MPI, NCCL, torch.distributed, threads).
class RankExchange {
 public:
  virtual ~RankExchange() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Every rank passes `mine`, of the same size on every rank; `all` (world() * mine.size()
  // bytes) receives rank k's bytes at k * mine.size(). Collective: every rank of the group calls
  // it the same number of times with the same sizes. Throws on failure (a lost rank, a
  // timeout); load_group adds the tensors being exchanged to the error. The default throws
  // Error{kUnsupported}: an exchange implements all_gather, gather_parts, or both.
  virtual void all_gather(std::span<const std::byte> mine, std::span<std::byte> all);
  // One round of load_group, assembled in place: `round` holds rank k's part at
  // [cuts[k] - cuts[0], cuts[k + 1] - cuts[0]) (cuts: world() + 1 offsets, the same on every
  // rank; parts may differ in size, or be empty); this rank's part is filled, the call fills the
  // others'. `round` is host memory, or with `device` a CUDA device (LoadOptions::device) that
  // device's memory. Collective and failing like all_gather. The default goes through
  // all_gather: every part padded to the largest and copied into place (through host memory for
  // a device); an override that moves each part straight into place (a broadcast from its rank)
  // needs no buffer besides the tensors'.
  virtual void gather_parts(std::span<std::byte> round, std::span<const uint64_t> cuts,
                            const Device& device);
};

// load_rank for every rank of `exchange`'s group at once, with every byte of the Replicate
// tensors read from storage once across the group: they lie one after another (each 256-byte
// aligned) in one allocation, assembled in rounds of at most `budget_bytes`, each rank reading
// its 1/world part of a round into its place and gather_parts filling in the rest. On a device
// (options.device) a rank's part goes through the staging ring as in load_rank, and the rounds
// are assembled in device memory. Shard and box tensors are read as load_rank reads them. The
// rank's reads run on a thread of their own, ahead of the exchange (its parts in round
// order, then its Shard and box tensors), while gather_parts is called on the calling thread,
// once per round in order, each call once this rank's part of its round is read. Every rank must
// call it with the same checkpoint and a plan resolved from the same RankPlan. Throws
// Error{kInvalidArgument} when the plan's rank or world is not the exchange's; an exchange
// failure is rethrown as Error{kIo} naming this rank and the tensors of the round. A failed read
// is rethrown as it was thrown: before the round whose part it is (this rank makes no further
// gather_parts call), or, for a Shard or box tensor, after the last round.
std::vector<Tensor> load_group(const Checkpoint& checkpoint, const RankLoadPlan& plan,
                               RankExchange& exchange, uint64_t budget_bytes = 64ull << 20,
                               const LoadOptions& options = {});

}  // namespace ckpt
