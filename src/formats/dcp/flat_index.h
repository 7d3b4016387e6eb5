#pragma once
// FlatIndex: a hash index of items that live elsewhere (a vector of entries, of storage items,
// of trie nodes), each known by its number. One array of slots, open addressing with linear
// probing; a slot holds the item's number and 32 bits of its key's hash, so a lookup reads one
// slot (rarely a few) and compares keys only where the hashes agree. The DCP reader indexes
// hundreds of thousands of keys several times over: std::unordered_map's node per key, its
// allocation, its free and the key hashed again along a bucket's chain were nearly half the CPU
// time of opening such a folder (docs/benchmarks/dcp.md).
//
// The keys come from files: callers hash strings with name_hash (util/name_index.h, seeded per
// process), and the slot of a hash is chosen after mixing it with a per-process seed too, so a
// file cannot be crafted offline to put its keys in one probe run.
//
// Layer: formats. Thread-safety: find() may run concurrently on an index that no longer
// changes; find_or_add() may not.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "util/name_index.h"

namespace ckpt::internal {

class FlatIndex {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;  // "not found"; never an item's number

  // `expected`: how many items will be added (the slots are made for them at once).
  FlatIndex() : FlatIndex(0) {}
  explicit FlatIndex(size_t expected) : seed_(name_hash({})) {
    size_t cap = 16;
    while (cap < 2 * expected) cap *= 2;
    resize(cap);
  }

  size_t size() const { return count_; }

  // The item stored under the key that hashes to `hash`, or kNone. `same(i)`: is item i's key
  // the one looked for?
  template <class Same>
  uint32_t find(uint64_t hash, Same&& same) const {
    const uint32_t h = fold(hash ^ seed_);
    for (size_t s = h & mask_;; s = (s + 1) & mask_) {
      const Slot& slot = slots_[s];
      if (slot.item == kNone) return kNone;
      if (slot.hash == h && same(slot.item)) return slot.item;
    }
  }

  // Brings the first slot of `hash` into the cache, ahead of its find() or find_or_add(): a
  // loop over hundreds of thousands of keys otherwise waits on a cache miss for each. (GCC 12
  // drops a __builtin_prefetch of this address as a dead store, hence the asm on x86-64.)
  void prefetch(uint64_t hash) const {
    const Slot* slot = slots_.data() + (fold(hash ^ seed_) & mask_);
#if defined(__x86_64__)
    asm volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(slot)));
#else
    __builtin_prefetch(slot);
#endif
  }

  // As find(); when no item has the key, stores `item` under it and returns `item`.
  template <class Same>
  uint32_t find_or_add(uint64_t hash, size_t item, Same&& same) {
    if (item >= kNone) throw std::length_error("FlatIndex: more than 2^32 - 1 items");
    if (2 * (count_ + 1) > slots_.size()) resize(2 * slots_.size());
    const uint32_t h = fold(hash ^ seed_);
    for (size_t s = h & mask_;; s = (s + 1) & mask_) {
      Slot& slot = slots_[s];
      if (slot.item == kNone) {
        slot = Slot{h, static_cast<uint32_t>(item)};
        ++count_;
        return slot.item;
      }
      if (slot.hash == h && same(slot.item)) return slot.item;
    }
  }

 private:
  struct Slot {
    uint32_t hash = 0;
    uint32_t item = kNone;
  };
  // 64 bits of hash to 32, mixed (std::hash of an int is the int itself).
  static uint32_t fold(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return static_cast<uint32_t>(h);
  }
  void resize(size_t cap) {
    std::vector<Slot> old(cap);
    old.swap(slots_);
    mask_ = cap - 1;
    for (const Slot& slot : old) {
      if (slot.item == kNone) continue;
      size_t s = slot.hash & mask_;
      while (slots_[s].item != kNone) s = (s + 1) & mask_;
      slots_[s] = slot;
    }
  }

  uint64_t seed_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t count_ = 0;
};

}  // namespace ckpt::internal
