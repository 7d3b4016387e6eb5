// The DCP writer (dcp_writer.h, include/ckpt/dcp.h). Three steps, each whole before the next:
//  1. flatten: the tree walked as DCP's traverse_state_dict walks it (torch/distributed/
//     checkpoint/_traverse.py): a dict is always walked, a list only when it holds a tensor, a
//     dict or a list that is walked, anything else is a leaf; keys are str(key) joined by "."
//     (_nested_dict.py, flatten_state_dict), the path kept for planner_data. Every tensor is
//     checked here, before a file exists.
//  2. plan: which file (rank) gets which item: tensors cut along dim 0 as Shard(0) cuts them.
//  3. write: per file the bytes items, then the tensor chunks (filesystem.py,
//     _write_files_from_queue writes in that order), each a torch.save zip of its own (a chunk:
//     the chunk alone, contiguous), then `.metadata` last.

#include "formats/dcp/dcp_writer.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "ckpt/error.h"
#include "ckpt/options.h"
#include "ckpt/sink.h"
#include "ckpt/torch.h"

namespace ckpt::internal {
namespace {

constexpr uint32_t kMaxFiles = 4096;

// The items of one torch.save blob inside a data file: positions count from the blob's start
// (torch.save writes each item into a stream of its own; the zip's offsets are the blob's).
class BlobSink final : public ByteSink {
 public:
  explicit BlobSink(ByteSink& file) : file_(file), base_(file.position()) {}
  const std::string& name() const override { return file_.name(); }
  void write(std::span<const std::byte> bytes) override { file_.write(bytes); }
  using ByteSink::write;
  void patch(uint64_t offset, std::span<const std::byte> bytes) override {
    file_.patch(base_ + offset, bytes);
  }
  uint64_t position() const override { return file_.position() - base_; }
  void reserve(uint64_t size) override { file_.reserve(size); }
  void commit() override {}  // the folder commits the file

 private:
  ByteSink& file_;
  const uint64_t base_;
};

// A leaf of the flattened tree.
struct Leaf {
  size_t entry;
  ConstValuePtr value;  // bytes items
  size_t tensor = 0;    // tensor items: index into the content's tensors
};

bool is_numpy(const Value& v) {
  return v.origin() && v.origin()->module().rfind("numpy", 0) == 0;
}
// What DCP treats as a tensor (isinstance(value, torch.Tensor)): a numpy array is a value.
bool is_tensor(const ConstValuePtr& v) {
  return v && v->kind() == Value::Kind::kTensor && !is_numpy(*v);
}

class Flattener {
 public:
  Flattener(const std::vector<Tensor>& tensors, DcpWrittenState& state, std::vector<Leaf>& leaves)
      : tensors_(tensors), state_(state), leaves_(leaves) {}

  void run(const ConstValuePtr& root) {
    if (!root) {
      // A dict of the tensors by name.
      for (size_t i = 0; i < tensors_.size(); ++i) {
        path_ = {Value::string(tensors_[i].name())};
        add_tensor(i);
      }
      return;
    }
    if (!root->is_dict())
      throw Error(ErrorCode::kInvalidArgument,
                  "DCP stores a state dict (a dict at the top), not " + root->repr());
    walk(root, 0);
  }

 private:
  [[noreturn]] void fail(ErrorCode code, const std::string& what) const {
    throw Error(code, what, {}, fqn());
  }

  std::string fqn() const {
    std::string s;
    for (const auto& p : path_) {
      if (!s.empty()) s += '.';
      s += p->kind() == Value::Kind::kInt ? std::to_string(p->as_int()) : p->str();
    }
    return s;
  }

  // _traverse.py's _is_terminal for a list: no tensor, no dict and no walked list inside.
  bool terminal_list(const Value& list, uint32_t depth) const {
    if (depth > Limits{}.max_pickle_depth) too_deep();
    for (const auto& e : list.items()) {
      if (!e) continue;
      if (e->is_dict() || is_tensor(e)) return false;
      if (e->kind() == Value::Kind::kList && !terminal_list(*e, depth + 1)) return false;
    }
    return true;
  }

  [[noreturn]] void too_deep() const {
    throw Error(ErrorCode::kLimitExceeded,
                "the tree is nested deeper than Limits::max_pickle_depth (" +
                    std::to_string(Limits{}.max_pickle_depth) + ")",
                {}, fqn());
  }

  // str(key) as Python prints it, for the keys a state dict has.
  ValuePtr key_text(const ConstValuePtr& k) const {
    if (k && k->kind() == Value::Kind::kString) return Value::string(k->str());
    if (k && k->kind() == Value::Kind::kInt && k->is_big_int()) return Value::string(k->str());
    if (k && k->kind() == Value::Kind::kInt)
      return Value::string(std::to_string(k->as_int()));
    if (k && k->kind() == Value::Kind::kBool)
      return Value::string(k->as_bool() ? "True" : "False");
    if (k && k->kind() == Value::Kind::kNone) return Value::string("None");
    fail(ErrorCode::kUnsupported, "a dict key " + (k ? k->repr() : std::string("?")) +
                                      " is not a string, an int, a bool or None: DCP keys are "
                                      "str(key)");
  }

  void walk(const ConstValuePtr& v, uint32_t depth) {
    if (depth > Limits{}.max_pickle_depth) too_deep();
    const bool container = v && (v->is_dict() || v->kind() == Value::Kind::kList);
    if (container && !open_.insert(v.get()).second)
      fail(ErrorCode::kInvalidArgument, "the tree contains itself (a cycle)");
    if (v && v->is_dict()) {
      // A dict's BUILD state (an OrderedDict's _metadata) is not an item: DCP walks items().
      for (const auto& [k, val] : v->entries()) {
        path_.push_back(key_text(k));
        walk(val, depth + 1);
        path_.pop_back();
      }
    } else if (v && v->kind() == Value::Kind::kList && !terminal_list(*v, depth)) {
      for (size_t i = 0; i < v->items().size(); ++i) {
        path_.push_back(Value::integer(static_cast<int64_t>(i)));
        walk(v->items()[i], depth + 1);
        path_.pop_back();
      }
    } else if (is_tensor(v)) {
      add_tensor(v->tensor_index());
    } else {
      Leaf leaf{new_entry(true), v ? v : Value::none()};
      leaves_.push_back(std::move(leaf));
    }
    if (container) open_.erase(v.get());
  }

  size_t new_entry(bool is_bytes) {
    DcpWrittenEntry e;
    e.fqn = fqn();
    if (path_.empty() || !fqns_.insert(e.fqn).second)
      fail(ErrorCode::kInvalidArgument,
           "two paths of the tree flatten to the same key (DCP joins keys with '.')");
    e.path = path_;
    e.is_bytes = is_bytes;
    state_.entries.push_back(std::move(e));
    return state_.entries.size() - 1;
  }

  void add_tensor(size_t index) {
    if (index >= tensors_.size())
      fail(ErrorCode::kInvalidArgument, "the tree refers to tensor #" + std::to_string(index) +
                                            " of " + std::to_string(tensors_.size()));
    const Tensor& t = tensors_[index];
    const TensorInfo& info = t.info();
    if (info.quantization) fail(ErrorCode::kUnsupported, "quantized tensors cannot be written to DCP");
    if (t.storage() && t.storage()->info.meta)
      fail(ErrorCode::kUnsupported,
           "is a meta tensor (a dtype and shape without bytes), which DCP cannot hold");
    if (dtype_size(info.dtype) == 0)
      fail(ErrorCode::kUnsupported,
           "dtype " + std::string(dtype_name(info.dtype)) + " cannot be written to DCP");
    if (t.storage() && !t.storage()->on_host())
      fail(ErrorCode::kUnsupported, "a tensor on a device is written from host memory only");
    if (info.numel() > 0 && (!t.storage() || (!t.storage()->data && t.storage()->info.nbytes)))
      fail(ErrorCode::kInvalidArgument, "tensor has no data loaded");
    const size_t entry = new_entry(false);
    DcpWrittenEntry& e = state_.entries[entry];
    e.dtype = info.dtype;
    e.size = info.shape;
    e.requires_grad = info.requires_grad;
    leaves_.push_back(Leaf{entry, nullptr, index});
  }

  const std::vector<Tensor>& tensors_;
  DcpWrittenState& state_;
  std::vector<Leaf>& leaves_;
  std::vector<ValuePtr> path_;
  std::unordered_set<std::string> fqns_;
  std::unordered_set<const Value*> open_;  // dicts and lists on the current path
};

// One item to write into a file.
struct Planned {
  size_t leaf;
  int64_t row_begin = 0, rows = 0;  // tensor chunks: rows of dim 0 (whole: all of them)
};

std::string data_file(uint32_t rank) { return "__" + std::to_string(rank) + "_0.distcp"; }

class DcpWriter final : public Writer {
 public:
  explicit DcpWriter(const DcpSaveOptions& o) : files_(o.files) {
    if (files_ == 0 || files_ > kMaxFiles)
      throw Error(ErrorCode::kInvalidArgument,
                  "DCP files must be 1 to " + std::to_string(kMaxFiles) + ", not " +
                      std::to_string(files_));
  }

  const WriterCaps& caps() const override {
    static const WriterCaps caps = [] {
      WriterCaps c;
      c.format = "dcp";
      c.object_tree = true;
      c.copies_shared = true;  // every key its own item, as dcp.save writes them
      c.several_files = true;
      return c;
    }();
    return caps;
  }
  bool holds(DType d) const override {
    return dtype_size(d) != 0 && !dtype_info(d).is_quantized;
  }

  WriteResult write(WriteOutput& out, WriteContent& content) override {
    DcpWrittenState state;
    std::vector<Leaf> leaves;
    Flattener(content.tensors, state, leaves).run(content.root);
    const std::vector<std::vector<Planned>> plan = make_plan(content.tensors, state, leaves);
    for (uint32_t r = 0; r < files_; ++r) {
      const std::string name = data_file(r);
      ByteSink& file = out.file(name);
      for (const Planned& p : plan[r]) {
        const Leaf& leaf = leaves[p.leaf];
        DcpWrittenItem item;
        item.entry = leaf.entry;
        item.file = name;
        item.offset = file.position();
        BlobSink blob(file);
        SaveOptions so;
        so.archive_name = "archive";  // torch.save into a stream
        if (leaf.value) {
          save_torch(blob, leaf.value, content.tensors, so);
        } else {
          Tensor chunk = chunk_of(content.tensors[leaf.tensor], p, item);
          save_torch(blob, Value::tensor(0), {chunk}, so);
        }
        item.length = file.position() - item.offset;
        state.items.push_back(std::move(item));
      }
    }
    // Last: a reader that finds `.metadata` finds every item it names.
    out.file(".metadata").write(dcp_metadata_pickle(state));
    return {};
  }

 private:
  std::vector<std::vector<Planned>> make_plan(const std::vector<Tensor>& tensors,
                                              const DcpWrittenState& state,
                                              const std::vector<Leaf>& leaves) const {
    std::vector<std::vector<Planned>> bytes_items(files_), tensor_items(files_);
    std::vector<uint64_t> load(files_, 0);
    size_t n_bytes = 0;
    for (size_t i = 0; i < leaves.size(); ++i) {
      const Leaf& leaf = leaves[i];
      if (leaf.value) {
        bytes_items[n_bytes++ % files_].push_back(Planned{i});
        continue;
      }
      const DcpWrittenEntry& e = state.entries[leaf.entry];
      const uint64_t nbytes = tensors[leaf.tensor].info().nbytes();
      const int64_t rows = e.size.empty() ? 0 : e.size[0];
      if (files_ > 1 && rows > 0 && nbytes > 0) {
        // Shard(0): ceil(rows / files) rows per rank; ranks past the end hold no chunk.
        const int64_t per = (rows + files_ - 1) / files_;
        for (uint32_t r = 0; r < files_ && int64_t(r) * per < rows; ++r) {
          const int64_t begin = int64_t(r) * per;
          const int64_t n = std::min(per, rows - begin);
          tensor_items[r].push_back(Planned{i, begin, n});
          load[r] += nbytes / rows * n;
        }
      } else {
        // Whole: to the file holding the fewest bytes so far.
        const uint32_t r =
            static_cast<uint32_t>(std::min_element(load.begin(), load.end()) - load.begin());
        tensor_items[r].push_back(Planned{i, 0, rows});
        load[r] += nbytes;
      }
    }
    for (uint32_t r = 0; r < files_; ++r)
      bytes_items[r].insert(bytes_items[r].end(), tensor_items[r].begin(), tensor_items[r].end());
    return bytes_items;
  }

  // The chunk as a contiguous tensor of its own (a view of the input's bytes when the input is
  // contiguous, else of a contiguous copy), and its box.
  static Tensor chunk_of(const Tensor& t, const Planned& p, DcpWrittenItem& item) {
    const TensorInfo& info = t.info();
    std::vector<int64_t> sizes = info.shape;
    item.offsets.assign(sizes.size(), 0);
    const uint64_t nbytes = info.nbytes();
    if (nbytes == 0) {
      item.sizes = sizes;
      return Tensor::from_bytes(info.name, info.dtype, sizes, {});
    }
    const std::byte* base;
    std::shared_ptr<const void> keep;
    if (info.is_contiguous()) {
      base = t.data();
      keep = t.storage();
    } else {
      auto copy = std::make_shared<std::vector<std::byte>>(t.contiguous_bytes());
      base = copy->data();
      keep = copy;
    }
    uint64_t begin = 0, length = nbytes;
    if (!sizes.empty()) {
      const uint64_t row = nbytes / static_cast<uint64_t>(sizes[0]);
      begin = row * static_cast<uint64_t>(p.row_begin);
      length = row * static_cast<uint64_t>(p.rows);
      item.offsets[0] = p.row_begin;
      sizes[0] = p.rows;
    }
    item.sizes = sizes;
    return Tensor::from_bytes(info.name, info.dtype, std::move(sizes),
                              std::span<const std::byte>(base + begin, length), std::move(keep));
  }

  const uint32_t files_;
};

}  // namespace

std::unique_ptr<Writer> make_dcp_writer(const DcpSaveOptions& options) {
  return std::make_unique<DcpWriter>(options);
}

}  // namespace ckpt::internal

namespace ckpt {

void save_dcp(const std::string& dir, const ConstValuePtr& root,
              const std::vector<Tensor>& tensors, const DcpSaveOptions& options) {
  std::unique_ptr<internal::Writer> writer = internal::make_dcp_writer(options);
  internal::WriteContent content;
  content.tensors = tensors;
  content.root = root;
  std::unique_ptr<FolderSink> folder = create_folder_sink(dir, FolderSinkOptions{false, options.fsync});
  internal::FolderOutput out(*folder);
  writer->write(out, content);
  out.commit();
}

}  // namespace ckpt
