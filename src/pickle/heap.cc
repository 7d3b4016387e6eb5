#include "pickle/heap.h"

#include <algorithm>
#include <bit>
#include <string>
#include <unordered_map>

#include "ckpt/error.h"
#include "pickle/builtin_calls.h"

namespace ckpt::internal {

PickleHeap::PickleHeap(std::span<const std::byte> input) : input_(input) {
  // Typical pickles make about one node per 7 bytes (a torch state dict: 14 nodes and 13 tuple
  // elements per ~104-byte entry); reserving a little more than that spares a reallocation
  // that copies every node.
  nodes_.reserve(16 + input.size() / 6);
  pool_.reserve(16 + input.size() / 6);  // (a hostile pickle's reserve is bounded by its size)
  nodes_.push_back(Node{});              // kNoRef
  nodes_.push_back(Node{Kind::kNone});   // kNone
  nodes_.push_back(Node{Kind::kBool, 0, 0, 0});  // kFalse
  nodes_.push_back(Node{Kind::kBool, 0, 0, 1});  // kTrue
  nodes_.push_back(Node{Kind::kTuple});          // kEmptyTuple
  lists_.emplace_back();
}

void PickleHeap::too_many_nodes() const {
  if (node_limit_ >= UINT32_MAX)
    throw Error(ErrorCode::kLimitExceeded, "pickle makes more than 2^32 objects");
  throw Error(ErrorCode::kLimitExceeded,
              "pickle makes more than " + std::to_string(node_limit_) + " objects (" +
                  std::to_string(node_limit_ * kBytesPerObject >> 20) + " MiB); " + limit_why_);
}

void PickleHeap::set_memory_limit(uint64_t bytes, std::string why) {
  node_limit_ =
      std::max<uint64_t>(std::min<uint64_t>(bytes / kBytesPerObject, UINT32_MAX), nodes_.size());
  limit_why_ = std::move(why);
}

double PickleHeap::float_value(Ref r) const { return std::bit_cast<double>(nodes_[r].b); }

std::complex<double> PickleHeap::complex_value(Ref r) const {
  return {std::bit_cast<double>(nodes_[r].b), std::bit_cast<double>(nodes_[r].c)};
}

std::string_view PickleHeap::text(Ref r) const {
  const Node& n = nodes_[r];
  if (n.kind == Kind::kInt) {
    if (!(n.flags & kBig)) return {};
    return std::string_view(chars_).substr(n.c, n.a);
  }
  if (n.kind != Kind::kString && n.kind != Kind::kBytes) return {};
  if (n.flags & kInInput) return {reinterpret_cast<const char*>(input_.data()) + n.b, n.c};
  return std::string_view(chars_).substr(n.b, n.c);
}

std::string_view PickleHeap::module(Ref r) const {
  const Node& n = nodes_[r];
  if (n.kind == Kind::kGlobal) return globals_[n.a].first;
  Ref c = cls(r);
  return c ? module(c) : std::string_view();
}

std::string_view PickleHeap::name(Ref r) const {
  const Node& n = nodes_[r];
  if (n.kind == Kind::kGlobal) return globals_[n.a].second;
  Ref c = cls(r);
  return c ? name(c) : std::string_view();
}

Ref PickleHeap::cls(Ref r) const {
  const Node& n = nodes_[r];
  if (n.kind == Kind::kDict) return static_cast<Ref>(n.b);
  if (n.kind == Kind::kObject) return static_cast<Ref>(n.c & 0xffffffffu);
  return kNoRef;
}

Ref PickleHeap::dict_args(Ref r) const {
  const Node& n = nodes_[r];
  return n.kind == Kind::kDict ? static_cast<Ref>(n.c >> 32) : kNoRef;
}

bool PickleHeap::foreign(Ref r) const {
  const Node& n = nodes_[r];
  if (n.kind == Kind::kGlobal) return n.flags & kForeign;
  Ref c = cls(r);
  return c != kNoRef && (nodes_[c].flags & kForeign);
}

std::span<const Ref> PickleHeap::appended(Ref r) const {
  if (object_lists_.empty()) return {};
  auto it = object_lists_.find(r);
  if (it == object_lists_.end() || it->second.first == 0) return {};
  return lists_[it->second.first];
}

std::span<const Ref> PickleHeap::object_entries(Ref r) const {
  if (object_lists_.empty()) return {};
  auto it = object_lists_.find(r);
  if (it == object_lists_.end() || it->second.second == 0) return {};
  return lists_[it->second.second];
}

Ref PickleHeap::origin(Ref r) const {
  if (origins_.empty()) return kNoRef;
  auto it = origins_.find(r);
  return it == origins_.end() ? kNoRef : it->second;
}

std::vector<Ref>& PickleHeap::object_list(Ref obj, bool entries) {
  auto& slots = object_lists_[obj];
  uint32_t& idx = entries ? slots.second : slots.first;
  if (idx == 0) {
    idx = static_cast<uint32_t>(lists_.size());
    lists_.emplace_back();
  }
  return lists_[idx];
}

void PickleHeap::object_append(Ref obj, std::span<const Ref> items) {
  if (items.empty()) return;
  std::vector<Ref> tmp(items.begin(), items.end());  // `items` may alias lists_
  std::vector<Ref>& out = object_list(obj, false);
  out.insert(out.end(), tmp.begin(), tmp.end());
}

void PickleHeap::object_set_items(Ref obj, std::span<const Ref> pairs) {
  if (pairs.empty()) return;
  std::vector<Ref> tmp(pairs.begin(), pairs.end());
  std::vector<Ref>& out = object_list(obj, true);
  out.insert(out.end(), tmp.begin(), tmp.end());
}

void PickleHeap::set_origin(Ref value, Ref origin) { origins_[value] = origin; }

void PickleHeap::become(Ref r, Ref value) {
  Ref old = add(nodes_[r]);
  if (auto it = object_lists_.find(r); it != object_lists_.end()) {
    auto lists = it->second;
    object_lists_.erase(it);
    object_lists_[old] = lists;
  }
  if (auto it = origins_.find(r); it != origins_.end()) {
    Ref o = it->second;
    origins_.erase(it);
    origins_[old] = o;
  }
  nodes_[r] = nodes_[value];
  origins_[r] = old;
}

size_t PickleHeap::child_count(Ref r) const {
  return items(r).size() + 4 + appended(r).size() + object_entries(r).size();
}

Ref PickleHeap::child_at(Ref r, size_t k) const {
  auto it = items(r);
  if (k < it.size()) return it[k];
  k -= it.size();
  if (k == 0) return state(r);
  if (k == 1) return dict_args(r);
  if (k == 2) return origin(r);
  if (k == 3) return kNoRef;
  k -= 4;
  auto ap = appended(r);
  if (k < ap.size()) return ap[k];
  k -= ap.size();
  auto en = object_entries(r);
  return k < en.size() ? en[k] : kNoRef;
}

Ref PickleHeap::state(Ref r) const {
  const Node& n = nodes_[r];
  if (n.kind == Kind::kDict) return static_cast<Ref>(n.c & 0xffffffffu);
  if (n.kind == Kind::kObject) return static_cast<Ref>(n.c >> 32);
  return kNoRef;
}

bool PickleHeap::is_container(Ref r) const {
  if (!origins_.empty() && origins_.count(r)) return true;
  switch (nodes_[r].kind) {
    case Kind::kTuple:
      return nodes_[r].c != 0;
    case Kind::kList:
    case Kind::kSet:
    case Kind::kDict:
    case Kind::kObject:
      return true;
    default:
      return false;
  }
}

Ref PickleHeap::big_integer(std::string_view digits) {
  Node n{Kind::kInt, kBig, static_cast<uint32_t>(digits.size()), 0, chars_.size()};
  chars_.append(digits);
  return add(n);
}

Ref PickleHeap::real(double v) { return add(Node{Kind::kFloat, 0, 0, std::bit_cast<uint64_t>(v)}); }

Ref PickleHeap::complex(std::complex<double> v) {
  return add(Node{Kind::kComplex, 0, 0, std::bit_cast<uint64_t>(v.real()),
                  std::bit_cast<uint64_t>(v.imag())});
}

Ref PickleHeap::string(std::string_view utf8) {
  Node n{Kind::kString, 0, 0, chars_.size(), utf8.size()};
  chars_.append(utf8);
  return add(n);
}

Ref PickleHeap::bytes(std::string_view raw, bool bytearray) {
  Node n{Kind::kBytes, static_cast<uint8_t>(bytearray ? kByteArray : 0), 0, chars_.size(),
         raw.size()};
  chars_.append(raw);
  return add(n);
}

Ref PickleHeap::tuple(std::span<const Ref> items) {
  if (items.empty()) return kEmptyTuple;
  const uint64_t start = pool_.size();
  // `items` may be a span of pool_ itself, which insert would invalidate while reading it.
  if (!pool_.empty() && items.data() >= pool_.data() &&
      items.data() < pool_.data() + pool_.size()) {
    const size_t from = items.data() - pool_.data(), n = items.size();
    pool_.reserve(pool_.size() + n);
    for (size_t i = 0; i < n; ++i) pool_.push_back(pool_[from + i]);
  } else {
    pool_.insert(pool_.end(), items.begin(), items.end());
  }
  return add(Node{Kind::kTuple, 0, 0, start, items.size()});
}

std::vector<Ref>& PickleHeap::list_of(Ref r) {
  Node& n = nodes_[r];
  if (n.a == 0) {
    n.a = static_cast<uint32_t>(lists_.size());
    lists_.emplace_back();
  }
  return lists_[n.a];
}

Ref PickleHeap::list(std::span<const Ref> items) {
  Ref r = add(Node{Kind::kList});
  if (!items.empty()) append(r, items);
  return r;
}

Ref PickleHeap::set(std::span<const Ref> items, bool frozen) {
  Ref r = add(Node{Kind::kSet, static_cast<uint8_t>(frozen ? kFrozen : 0)});
  if (!items.empty()) append(r, items);
  return r;
}

Ref PickleHeap::dict(Ref cls, Ref args) {
  if (args != kNoRef) dict_args_used_ = true;
  return add(Node{Kind::kDict, 0, 0, cls, static_cast<uint64_t>(args) << 32});
}

Ref PickleHeap::global(std::string_view module, std::string_view name, bool foreign) {
  globals_.emplace_back(std::string(module), std::string(name));
  return add(Node{Kind::kGlobal, static_cast<uint8_t>(foreign ? kForeign : 0),
                  static_cast<uint32_t>(globals_.size() - 1)});
}

void PickleHeap::append(Ref container, std::span<const Ref> items) {
  if (items.empty()) return;
  // Copy first: `items` may point into the vector that grows (l.extend(l) is no pickle opcode,
  // but a caller's span may still alias).
  std::vector<Ref> tmp;
  const std::vector<Ref>& dst = list_of(container);
  if (!dst.empty() && items.data() >= dst.data() && items.data() < dst.data() + dst.size()) {
    tmp.assign(items.begin(), items.end());
    items = tmp;
  }
  std::vector<Ref>& out = list_of(container);
  out.insert(out.end(), items.begin(), items.end());
}

void PickleHeap::set_state(Ref obj, Ref state) {
  Node& n = nodes_[obj];
  if (n.kind == Kind::kDict) {
    n.c = (n.c & ~uint64_t{0xffffffffu}) | state;
  } else {
    n.c = (n.c & 0xffffffffu) | (static_cast<uint64_t>(state) << 32);
  }
}

bool PickleHeap::has_cycle(std::span<const Ref> roots, std::vector<uint8_t> acyclic) const {
  // Colors: 0 unseen, 1 on the current DFS path, 2 finished (or known to reach no cycle).
  std::vector<uint8_t> color = std::move(acyclic);
  color.resize(nodes_.size());
  for (uint8_t& c : color) c = c ? 2 : 0;
  struct Frame {
    Ref r;
    size_t next;
    size_t total;  // child_count(r): the heap does not change during the walk
  };
  std::vector<Frame> path;
  for (Ref root : roots) {
    if (!is_container(root) || color[root]) continue;
    color[root] = 1;
    path.push_back({root, 0, child_count(root)});
    while (!path.empty()) {
      Frame& f = path.back();
      if (f.next == f.total) {
        color[f.r] = 2;
        path.pop_back();
        continue;
      }
      Ref c = child_at(f.r, f.next++);
      if (c == kNoRef || !is_container(c)) continue;
      if (!color[c]) {
        color[c] = 1;
        path.push_back({c, 0, child_count(c)});
      } else if (color[c] == 1) {
        return true;
      }
    }
  }
  return false;
}

void PickleHeap::check_tree(Ref root, CopyBudget& budget, uint32_t max_depth,
                            std::vector<uint8_t>* reached) const {
  // As to_value() walks: a node's height (the longest path below it) is found once; an
  // object's arguments (and a dict's class arguments) count against `budget` once per node.
  constexpr uint32_t kUnknown = UINT32_MAX, kOpen = UINT32_MAX - 1;
  std::vector<uint32_t> height(nodes_.size(), kUnknown);
  struct Frame {
    Ref r;
    size_t next;
    size_t total;  // child_count(r): the heap does not change during the walk
    uint32_t height;
  };
  std::vector<Frame> stack;
  auto too_deep = [max_depth]() {
    throw Error(ErrorCode::kLimitExceeded, "object tree deeper than Limits::max_pickle_depth (" +
                                               std::to_string(max_depth) + ")");
  };
  auto below = [&](uint32_t h) {  // the frame on top has a child of height h
    if (h >= max_depth) too_deep();
    stack.back().height = std::max(stack.back().height, h + 1);
  };
  auto enter = [&](Ref r) {
    if (nodes_[r].kind == Kind::kObject) budget.spend(items(r).size());
    if (nodes_[r].kind == Kind::kDict)
      if (Ref a = dict_args(r)) budget.spend(items(a).size());
    if (stack.size() > max_depth) too_deep();
    height[r] = kOpen;
    stack.push_back({r, 0, child_count(r), 0});
  };
  if (reached) reached->assign(nodes_.size(), 0);
  if (!is_container(root)) return;
  enter(root);
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.next < f.total) {
      const Ref c = child_at(f.r, f.next++);
      if (c == kNoRef) continue;
      if (height[c] == kOpen)
        throw Error(ErrorCode::kUnsupported,
                    "the object graph contains a cycle (a container that contains itself); "
                    "checkpoints never do");
      if (height[c] != kUnknown) {
        below(height[c]);
      } else if (is_container(c)) {
        enter(c);
      } else {
        height[c] = 0;
        below(0);
      }
      continue;
    }
    const Frame done = f;
    height[done.r] = done.height;
    stack.pop_back();
    if (!stack.empty()) below(done.height);
  }
  if (reached)
    for (size_t i = 0; i < height.size(); ++i) (*reached)[i] = height[i] != kUnknown;
}

ValuePtr PickleHeap::to_value(Ref root, CopyBudget& budget, uint32_t max_depth) const {
  // Containers are made as shells when first reached and filled in depth-first order by an
  // explicit stack (a hostile tree can nest 1e6 deep). made_at[r]: 1 + the index in `made` of
  // node r's Value, 0 while not made (4 bytes a node rather than 16: most nodes are temporaries
  // the result never reaches).
  std::vector<uint32_t> made_at(nodes_.size(), 0);
  std::vector<ValuePtr> made;
  std::vector<uint8_t> open(nodes_.size());  // 1 while the node's frame is on the stack
  // A frame fills one node's children by kind: its items (dict entries), then state, dict
  // arguments, origin, appended items and set entries of an object. `height`: the longest path
  // below the node among the children filled so far; heights[i]: that of made[i] once filled.
  struct Frame {
    Ref r;
    Value* v;
    size_t next;
    uint32_t height = 0;
  };
  std::vector<Frame> stack;
  std::vector<uint32_t> heights;
  auto too_deep = [max_depth]() {
    throw Error(ErrorCode::kLimitExceeded, "object tree deeper than Limits::max_pickle_depth (" +
                                               std::to_string(max_depth) + ")");
  };
  // The frame on top has a child of height `h`.
  auto below = [&](uint32_t h) {
    Frame& f = stack.back();
    if (h >= max_depth) too_deep();
    f.height = std::max(f.height, h + 1);
  };
  const bool extras = !origins_.empty() || !object_lists_.empty() || dict_args_used_;

  auto make = [&](Ref r) -> ValuePtr {
    if (made_at[r]) return made[made_at[r] - 1];
    const Node& n = nodes_[r];
    ValuePtr v;
    bool frame = false;
    switch (n.kind) {
      case Kind::kNone:
        v = Value::none();
        break;
      case Kind::kBool:
        v = Value::boolean(n.b != 0);
        break;
      case Kind::kInt:
        v = n.flags & kBig ? Value::big_integer(std::string(text(r)))
                           : Value::integer(static_cast<int64_t>(n.b));
        break;
      case Kind::kFloat:
        v = Value::real(float_value(r));
        break;
      case Kind::kComplex:
        v = Value::complex(complex_value(r));
        break;
      case Kind::kString:
        v = Value::string(std::string(text(r)));
        break;
      case Kind::kBytes:
        v = Value::bytes(std::string(text(r)), (n.flags & kByteArray) != 0);
        break;
      case Kind::kTensor:
        v = Value::tensor(static_cast<size_t>(n.b));
        break;
      case Kind::kGlobal:
        v = Value::global(globals_[n.a].first, globals_[n.a].second);
        if (n.flags & kForeign) v->set_foreign(true);
        break;
      case Kind::kObject:
        v = Value::object(std::string(module(r)), std::string(name(r)), {}, nullptr,
                          static_cast<int64_t>(n.b));
        if (foreign(r)) v->set_foreign(true);
        if (n.flags & kNewObjFlag) v->set_call(Value::Call::kNewObj);
        budget.spend(items(r).size());
        [[fallthrough]];
      case Kind::kDict:
        if (!v) {
          v = Value::dict_of(std::string(module(r)), std::string(name(r)));
          if (Ref a = dict_args(r)) budget.spend(items(a).size());
        }
        [[fallthrough]];
      case Kind::kTuple:
      case Kind::kList:
      case Kind::kSet:
        if (!v)
          v = n.kind == Kind::kTuple  ? Value::tuple()
              : n.kind == Kind::kList ? Value::list()
              : (n.flags & kFrozen)   ? Value::frozenset()
                                      : Value::set();
        frame = true;
        if (n.kind == Kind::kDict) {
          v->entries().reserve(items(r).size() / 2);
        } else {
          v->items().reserve(items(r).size());
        }
        break;
    }
    if (extras && (frame || origin(r) != kNoRef)) frame = true;
    if (frame) {
      if (stack.size() > max_depth) too_deep();  // early: the node sits stack.size() deep
      stack.push_back({r, v.get(), 0});
      open[r] = 1;
    }
    made.push_back(v);
    heights.push_back(0);
    made_at[r] = static_cast<uint32_t>(made.size());
    return v;
  };
  auto child = [&](Ref c) -> ValuePtr {
    if (open[c])  // a container that is being filled: a cycle (the VM refuses them first)
      throw Error(ErrorCode::kUnsupported,
                  "the object graph contains a cycle (a container that contains itself); "
                  "checkpoints never do");
    // A node already made is complete: its height is known. A new container's own frame
    // reports to this one when it closes.
    if (made_at[c]) {
      below(heights[made_at[c] - 1]);
      return made[made_at[c] - 1];
    }
    const size_t frames = stack.size();
    ValuePtr v = make(c);
    if (stack.size() == frames) below(0);
    return v;
  };

  ValuePtr result = make(root);
  while (!stack.empty()) {
    Frame& f = stack.back();
    auto it = items(f.r);
    if (f.next < it.size()) {
      const size_t k = f.next++;
      // A large container's elements (a state dict's keys and tensors) lie far apart in the
      // node vector: ask for the node 16 elements ahead before it is needed.
      if (k + 16 < it.size()) __builtin_prefetch(&nodes_[it[k + 16]]);
      Value* parent = f.v;  // `f` dies if make() pushes
      const Kind pk = parent->kind();
      ValuePtr cv = child(it[k]);
      if (pk == Kind::kDict) {
        if (k % 2 == 0) {
          parent->entries().emplace_back(std::move(cv), nullptr);
        } else {
          parent->entries().back().second = std::move(cv);
        }
      } else {
        parent->items().push_back(std::move(cv));
      }
      continue;
    }
    if (!extras && f.next == it.size()) {
      ++f.next;
      Ref s = state(f.r);
      if (s != kNoRef) {
        if (open[s])
          throw Error(ErrorCode::kUnsupported,
                      "the object graph contains a cycle (an object whose state contains it); "
                      "checkpoints never do");
        Value* parent = f.v;
        parent->set_state(child(s));
      }
      continue;
    }
    if (extras && f.next < child_count(f.r)) {
      // Past the items: state, dict arguments, origin, (unused), appended, object entries.
      const size_t k = f.next++ - it.size();
      Value* parent = f.v;
      const Ref r = f.r;
      Ref c = child_at(r, it.size() + k);
      if (c == kNoRef) continue;
      if (k == 0) {
        parent->set_state(child(c));
      } else if (k == 1) {
        auto args = items(c);
        std::vector<Ref> a(args.begin(), args.end());
        for (Ref x : a) {
          ValuePtr xv = child(x);
          parent->items().push_back(std::move(xv));
        }
      } else if (k == 2) {
        parent->set_origin(child(c));
      } else if (k - 4 < appended(r).size()) {
        parent->appended().push_back(child(c));
      } else {
        const size_t e = k - 4 - appended(r).size();
        ValuePtr cv = child(c);
        if (e % 2 == 0) {
          parent->entries().emplace_back(std::move(cv), nullptr);
        } else {
          parent->entries().back().second = std::move(cv);
        }
      }
      continue;
    }
    open[f.r] = 0;
    const uint32_t h = f.height;
    heights[made_at[f.r] - 1] = h;
    stack.pop_back();
    if (!stack.empty()) below(h);
  }
  // `made` holds one reference to every Value made, whose counts have long left the cache:
  // dropped in order, each count asked for 16 Values ahead (make_shared puts it just before
  // the Value).
  for (size_t i = 0; i < made.size(); ++i) {
    if (i + 16 < made.size())
      __builtin_prefetch(reinterpret_cast<const char*>(made[i + 16].get()) - 16, 1);
    made[i].reset();
  }
  return result;
}

}  // namespace ckpt::internal
