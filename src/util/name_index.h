#pragma once
// NameIndex: names -> positions in a caller's table (zip entries, tensors), for tables of tens of
// thousands of names that are built once and looked up a few times each.
//
// An open-addressing table (linear probing, load <= 2/3) of (hash tag, position) slots that stores
// no names: a lookup compares against the caller's table only when the 32-bit tags agree, so a
// probe costs no cache miss into the names. One allocation, no per-name node, no copies of the
// names: building and destroying an index of 20,000 names takes tens of microseconds, where an
// unordered_map<std::string, size_t> took milliseconds (a node and a string per name).
//
// The hash is seeded once per process, so that a file cannot be crafted offline to make every name
// land in one probe chain.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/error.h"

namespace ckpt::internal {

// 64-bit hash of a name, 8 bytes per step; seeded per process.
uint64_t name_hash(std::string_view s) noexcept;

class NameIndex {
 public:
  static constexpr size_t kMaxNames = UINT32_MAX - 1;

  NameIndex() = default;
  NameIndex(NameIndex&&) noexcept = default;
  NameIndex& operator=(NameIndex&&) noexcept = default;

  // Empties the index and sizes it for up to `n` names. Throws Error{kLimitExceeded} past
  // kMaxNames.
  void reset(size_t n) {
    if (n > kMaxNames)
      throw Error(ErrorCode::kLimitExceeded, std::to_string(n) +
                                                 " names are more than an index holds (" +
                                                 std::to_string(kMaxNames) + ")");
    const size_t cap = std::bit_ceil(std::max<size_t>(8, n + n / 2 + 1));
    slots_.reset(new Slot[cap]());  // value-initialized: pos 0 = empty
    mask_ = cap - 1;
    count_ = 0;
    limit_ = n;
  }
  size_t size() const noexcept { return count_; }

  // Adds `name` at position `pos` (< kMaxNames) unless the index already has it. Returns the
  // position already there, or nullopt when `name` was added. name_of(p) must return the name at
  // position p (a std::string_view or something that converts to one). At most `n` names (reset).
  template <class NameOf>
  std::optional<size_t> insert(std::string_view name, size_t pos, const NameOf& name_of) {
    const uint64_t h = name_hash(name);
    const uint32_t tag = static_cast<uint32_t>(h >> 32);
    for (size_t s = h & mask_;; s = (s + 1) & mask_) {
      Slot& slot = slots_[s];
      if (slot.pos == 0) {
        if (count_ >= limit_) throw Error(ErrorCode::kInvalidArgument, "NameIndex is full");
        slot.tag = tag;
        slot.pos = static_cast<uint32_t>(pos + 1);
        ++count_;
        return std::nullopt;
      }
      if (slot.tag == tag && std::string_view(name_of(slot.pos - 1)) == name) return slot.pos - 1;
    }
  }

  // Position of `name`, or nullopt.
  template <class NameOf>
  std::optional<size_t> find(std::string_view name, const NameOf& name_of) const {
    if (!slots_) return std::nullopt;
    const uint64_t h = name_hash(name);
    const uint32_t tag = static_cast<uint32_t>(h >> 32);
    for (size_t s = h & mask_;; s = (s + 1) & mask_) {
      const Slot& slot = slots_[s];
      if (slot.pos == 0) return std::nullopt;
      if (slot.tag == tag && std::string_view(name_of(slot.pos - 1)) == name) return slot.pos - 1;
    }
  }

 private:
  struct Slot {
    uint32_t tag;
    uint32_t pos;  // position + 1; 0 = empty
  };
  std::unique_ptr<Slot[]> slots_;
  size_t mask_ = 0, count_ = 0, limit_ = 0;
};

}  // namespace ckpt::internal
