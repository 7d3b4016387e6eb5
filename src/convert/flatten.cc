// flatten_state_dict: the names a flat format stores. The object tree is walked with an explicit
// stack and one shared path buffer, so that any depth costs neither call stack nor a copy of the
// path per level.

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ckpt/convert.h"
#include "ckpt/error.h"
#include "ckpt/torchscript.h"
#include "ckpt/value.h"

namespace ckpt {
namespace {

// Quantization parameters (per-channel scales and zero points) are part of their tensor.
bool listed(const TensorInfo& t) { return t.type != "qparams"; }

// The attributes torch's Module.state_dict() sets on the OrderedDict it returns: `_metadata`, the
// modules' version numbers (read back by load_state_dict for old layouts). No flat format stores
// them and none of their readers wants them, so dropping them is not worth a note.
bool only_module_versions(const Value& dict) {
  const ValuePtr& st = dict.state();
  if (!st || st->kind() != Value::Kind::kDict || st->entries().size() != 1) return false;
  const auto& key = st->entries()[0].first;
  return key && key->kind() == Value::Kind::kString && key->str() == "_metadata";
}

// Walks the tree depth-first in the order a recursive walk would, calling on_tensor(path, index)
// for every kTensor reached and collecting the paths of non-tensor values into `non_tensors`
// (when not null). Dicts, lists and tuples are containers; a container reached a second time
// (the pickle memo shares it) is not walked again; sets and objects are values. Root depth 0.
class TreeWalk {
 public:
  using OnTensor = std::function<void(const std::string& path, size_t index)>;
  TreeWalk(uint64_t max_depth, std::vector<std::string>* non_tensors, std::string source)
      : max_depth_(max_depth), non_tensors_(non_tensors), source_(std::move(source)) {}

  void run(const Value* root, const OnTensor& on_tensor) {
    on_tensor_ = &on_tensor;
    visit(root, 0);
    while (!stack_.empty()) {
      Frame& f = stack_.back();
      const Value* v = f.value;
      const size_t n = v->kind() == Value::Kind::kDict ? v->entries().size() : v->items().size();
      path_.resize(f.path_len);
      if (f.next < n) {
        const size_t i = f.next++;
        const Value* child;
        if (v->kind() == Value::Kind::kDict) {
          const auto& [k, val] = v->entries()[i];
          append(k ? path_component(*k) : std::string("?"));
          child = val.get();
        } else {
          append(std::to_string(i));
          child = v->items()[i].get();
        }
        visit(child, stack_.size());  // may grow stack_: `f` is not used after this
        continue;
      }
      if (v->kind() == Value::Kind::kDict && v->state() && non_tensors_ &&
          !only_module_versions(*v)) {
        append("<attributes of " + (v->name().empty() ? std::string("dict") : v->name()) + ">");
        non_tensors_->push_back(path_);
      }
      stack_.pop_back();
    }
    path_.clear();
  }

 private:
  struct Frame {
    const Value* value;
    size_t path_len;  // length of this container's path in path_
    size_t next = 0;  // its next child
  };

  void append(const std::string& component) {
    if (!path_.empty()) path_ += '.';
    path_ += component;
  }
  void add_non_tensor(bool root_name) {
    if (!non_tensors_) return;
    if (!path_.empty())
      non_tensors_->push_back(path_);
    else if (root_name)
      non_tensors_->push_back("<root>");
  }

  // `path_` holds v's path.
  void visit(const Value* v, size_t depth) {
    if (!v) return;
    if (depth > max_depth_)
      throw Error(
          ErrorCode::kLimitExceeded,
          "object tree deeper than Limits::max_pickle_depth (" + std::to_string(max_depth_) + ")",
          source_);
    switch (v->kind()) {
      case Value::Kind::kTensor:
        if (v->as_int() >= 0) (*on_tensor_)(path_, static_cast<size_t>(v->as_int()));
        return;
      case Value::Kind::kDict:
        // An empty container is structure a flat format loses too. Checked before `seen_`:
        // pickle shares one () between all its uses, and each path must be reported.
        if (v->entries().empty() && !v->state()) return add_non_tensor(false);
        break;
      case Value::Kind::kList:
      case Value::Kind::kTuple:
        if (v->items().empty()) return add_non_tensor(false);
        break;
      default:
        return add_non_tensor(true);
    }
    if (!seen_.insert(v).second) return;
    stack_.push_back(Frame{v, path_.size()});
  }

  const uint64_t max_depth_;
  std::vector<std::string>* non_tensors_;
  const std::string source_;
  const OnTensor* on_tensor_ = nullptr;
  std::vector<Frame> stack_;
  std::string path_;
  std::unordered_set<const Value*> seen_;
};

// Marks entries whose bytes an earlier entry has: the same storage, or a storage stored at the
// same place in the same file (which a mapped checkpoint hands out as the same memory; a sharded
// set's offsets are each in its own shard).
void find_sharing(const Checkpoint& c, std::vector<StateDictEntry>& entries) {
  const auto& tensors = c.tensors();
  const auto& storages = c.storages();
  std::unordered_map<size_t, size_t> by_storage;
  std::vector<std::unordered_map<uint64_t, size_t>> by_offset(c.files().size());
  for (size_t k = 0; k < entries.size(); ++k) {
    const size_t s = tensors[entries[k].tensor].storage;
    auto [it, fresh] = by_storage.emplace(s, k);
    size_t owner = it->second;
    if (fresh && s < storages.size()) {
      const StorageInfo& si = storages[s];
      if (si.offset != kNoOffset && !si.meta && si.nbytes > 0) {
        auto [it2, fresh2] = by_offset[c.files_of(entries[k].tensor)[0]].emplace(si.offset, k);
        if (!fresh2) {
          owner = it2->second;
          fresh = false;
        }
      }
    }
    if (!fresh) entries[k].shares_with = owner;
  }
}

}  // namespace

FlatStateDict flatten_state_dict(const Checkpoint& c, const FlattenOptions& options) {
  FlatStateDict out;
  const auto& tensors = c.tensors();
  constexpr size_t kNone = SIZE_MAX;
  std::vector<size_t> first(tensors.size(), kNone);  // tensor -> its first entry
  auto add = [&](std::string name, size_t index) {
    StateDictEntry e;
    e.name = std::move(name);
    e.tensor = index;
    if (first[index] == kNone)
      first[index] = out.entries.size();
    else
      e.alias_of = first[index];
    out.entries.push_back(std::move(e));
  };

  if (format_traits(c.format()).script) {
    // The module's parameters and buffers by module path, tied ones under each of their names:
    // the __torch__ module objects are no state dict.
    TorchScriptArchive a = TorchScriptArchive::from(c);
    for (const auto& [name, index] : a.state_dict())
      if (index < tensors.size() && listed(tensors[index])) add(name, index);
  } else {
    for (size_t i = 0; i < tensors.size(); ++i)
      if (listed(tensors[i])) add(tensors[i].name, i);
    // torch.save writes a tied weight once and reaches it from several keys; the tensor's name
    // is the first path, the others are aliases, which a flat format (no references) must
    // store as names of their own.
    const bool values = format_traits(c.format()).tree_values;
    const uint64_t max_depth = options.limits ? options.limits->max_pickle_depth : UINT64_MAX;
    std::vector<uint8_t> reached(tensors.size(), 0);
    TreeWalk walk(max_depth, values ? &out.non_tensors : nullptr, c.source().name());
    walk.run(c.root().get(), [&](const std::string& path, size_t index) {
      if (index >= tensors.size() || !listed(tensors[index])) return;
      if (!reached[index]) {
        reached[index] = 1;
        return;
      }
      if (path != tensors[index].name) add(path, index);
    });
  }
  find_sharing(c, out.entries);
  return out;
}

}  // namespace ckpt
