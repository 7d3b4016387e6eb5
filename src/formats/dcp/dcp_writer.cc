// The DCP writer (dcp_writer.h, include/ckpt/dcp.h). Three steps, each whole before the next:
//  1. flatten: the tree walked as DCP's traverse_state_dict walks it (torch/distributed/
//     checkpoint/_traverse.py): a dict is always walked, a list only when it holds a tensor, a
//     dict or a list that is walked, anything else is a leaf; keys are str(key) joined by "."
//     (_nested_dict.py, flatten_state_dict), the path kept for planner_data. Every tensor is
//     checked here, before a file exists.
//  2. plan: which file (rank) gets which item: tensors cut along dim 0 as Shard(0) cuts them.
//  3. write: per file the bytes items, then the tensor chunks (filesystem.py,
//     _write_files_from_queue writes in that order), each a torch.save zip of its own (a chunk:
//     the chunk alone, contiguous), then `.metadata` last. The tensors are taken in the tree's
//     order, each once (from a TensorFeed in a streamed conversion), and each file's chunk of
//     it is appended to that file. More files than the process may keep open are written a
//     group at a time, the tensors read once per group.

#include "formats/dcp/dcp_writer.h"

#include <sys/resource.h>

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

bool is_numpy(const Value& v) { return v.origin() && v.origin()->module().rfind("numpy", 0) == 0; }
// What DCP treats as a tensor (isinstance(value, torch.Tensor)): a numpy array is a value.
bool is_tensor(const ConstValuePtr& v) {
  return v && v->kind() == Value::Kind::kTensor && !is_numpy(*v);
}

class Flattener {
 public:
  // fed: the tensors' bytes come from a TensorFeed (their storages hold none yet).
  Flattener(const std::vector<Tensor>& tensors, DcpWrittenState& state, std::vector<Leaf>& leaves,
            bool fed)
      : tensors_(tensors), state_(state), leaves_(leaves), fed_(fed) {}

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
    if (k && k->kind() == Value::Kind::kInt) return Value::string(std::to_string(k->as_int()));
    if (k && k->kind() == Value::Kind::kBool) return Value::string(k->as_bool() ? "True" : "False");
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
    if (info.quantization)
      fail(ErrorCode::kUnsupported, "quantized tensors cannot be written to DCP");
    if (t.storage() && t.storage()->info.meta)
      fail(ErrorCode::kUnsupported,
           "is a meta tensor (a dtype and shape without bytes), which DCP cannot hold");
    if (dtype_size(info.dtype) == 0)
      fail(ErrorCode::kUnsupported,
           "dtype " + std::string(dtype_name(info.dtype)) + " cannot be written to DCP");
    if (t.storage() && !t.storage()->on_host())
      fail(ErrorCode::kUnsupported, "a tensor on a device is written from host memory only");
    if (info.numel() > 0 &&
        (!t.storage() || (!t.storage()->data && t.storage()->info.nbytes && !fed_)))
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
  const bool fed_;
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
      throw Error(ErrorCode::kInvalidArgument, "DCP files must be 1 to " +
                                                   std::to_string(kMaxFiles) + ", not " +
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
  bool holds(DType d) const override { return dtype_size(d) != 0 && !dtype_info(d).is_quantized; }

  WriteResult write(WriteOutput& out, WriteContent& content) override {
    const TensorFeed* feed = content.feed.get();
    DcpWrittenState state;
    std::vector<Leaf> leaves;
    Flattener(content.tensors, state, leaves, feed != nullptr).run(content.root);
    const std::vector<std::vector<Planned>> plan = make_plan(content.tensors, state, leaves);
    std::vector<ByteSink*> files(files_, nullptr);
    // One item at the end of file r: a torch.save of `root` over `tensors`.
    auto write_item = [&](uint32_t r, DcpWrittenItem item, const ConstValuePtr& root,
                          const std::vector<Tensor>& tensors) {
      ByteSink& file = *files[r];
      item.file = data_file(r);
      item.offset = file.position();
      BlobSink blob(file);
      SaveOptions so;
      so.archive_name = "archive";  // torch.save into a stream
      save_torch(blob, root, tensors, so);
      item.length = file.position() - item.offset;
      state.items.push_back(std::move(item));
    };
    const std::vector<Tensor> tensors = bytes_item_tensors(content, leaves);
    std::vector<std::vector<std::pair<uint32_t, const Planned*>>> chunks(leaves.size());
    for (uint32_t r = 0; r < files_; ++r)
      for (const Planned& p : plan[r])
        if (!leaves[p.leaf].value) chunks[p.leaf].emplace_back(r, &p);
    // The files are written a group at a time, each group's files open together and closed
    // (committed) before the next group's open, so that thousands of files stay within the
    // process's limit on open files; with more than one group, each pass reads the tensors that
    // have a chunk in its files again.
    const uint32_t group = files_per_pass();
    for (uint32_t g0 = 0; g0 < files_; g0 += group) {
      const uint32_t g1 = std::min(files_, g0 + group);
      for (uint32_t r = g0; r < g1; ++r) files[r] = &out.file(data_file(r));
      // Each file's bytes items first (filesystem.py writes them first)...
      for (uint32_t r = g0; r < g1; ++r)
        for (const Planned& p : plan[r])
          if (leaves[p.leaf].value) {
            DcpWrittenItem item;
            item.entry = leaves[p.leaf].entry;
            write_item(r, std::move(item), leaves[p.leaf].value, tensors);
          }
      // ...then the tensors in the tree's order, each read once per pass, its chunk for file r
      // appended to file r: every file gets its chunks in that order, as if written one file at
      // a time.
      std::vector<const Tensor*> order;
      std::vector<size_t> leaf_of;
      for (size_t i = 0; i < leaves.size(); ++i) {
        if (leaves[i].value) continue;
        const bool here = std::any_of(chunks[i].begin(), chunks[i].end(),
                                      [&](const auto& c) { return c.first >= g0 && c.first < g1; });
        if (!here) continue;
        order.push_back(&content.tensors[leaves[i].tensor]);
        leaf_of.push_back(i);
      }
      feed_each(feed, order, [&](size_t k, const Tensor& t) {
        for (const auto& [r, p] : chunks[leaf_of[k]]) {
          if (r < g0 || r >= g1) continue;
          DcpWrittenItem item;
          item.entry = leaves[p->leaf].entry;
          Tensor chunk = chunk_of(t, *p, item);
          write_item(r, std::move(item), Value::tensor(0), {chunk});
        }
      });
      if (g1 < files_)
        for (uint32_t r = g0; r < g1; ++r) files[r]->commit();
    }
    // The items file by file, in the order of their bytes.
    std::stable_sort(state.items.begin(), state.items.end(),
                     [](const DcpWrittenItem& a, const DcpWrittenItem& b) {
                       if (a.file.size() != b.file.size()) return a.file.size() < b.file.size();
                       return a.file != b.file ? a.file < b.file : a.offset < b.offset;
                     });
    // Last: a reader that finds `.metadata` finds every item it names.
    out.file(".metadata").write(dcp_metadata_pickle(state));
    return {};
  }

 private:
  // The tensors a bytes item's value refers to (a tuple of tensors is one item) are in memory
  // already, or with a feed copied out of it: a value is pickled whole.
  static std::vector<Tensor> bytes_item_tensors(const WriteContent& content,
                                                const std::vector<Leaf>& leaves) {
    std::vector<Tensor> tensors = content.tensors;
    if (!content.feed) return tensors;
    std::vector<size_t> refs;
    std::vector<const Value*> todo;
    std::unordered_set<const Value*> seen;
    for (const Leaf& leaf : leaves)
      if (leaf.value) todo.push_back(leaf.value.get());
    while (!todo.empty()) {
      const Value* v = todo.back();
      todo.pop_back();
      if (!v || !seen.insert(v).second) continue;
      if (v->kind() == Value::Kind::kTensor) refs.push_back(static_cast<size_t>(v->tensor_index()));
      for (const auto& item : v->items()) todo.push_back(item.get());
      for (const auto& [k, val] : v->entries()) {
        todo.push_back(k.get());
        todo.push_back(val.get());
      }
      if (v->state()) todo.push_back(v->state().get());
      for (const auto& item : v->appended()) todo.push_back(item.get());
    }
    std::sort(refs.begin(), refs.end());
    refs.erase(std::unique(refs.begin(), refs.end()), refs.end());
    std::vector<const Tensor*> order;
    for (size_t i : refs) order.push_back(&content.tensors.at(i));
    content.feed->each(order, [&](size_t k, const Tensor& t) {
      const TensorInfo& info = t.info();
      Tensor copy = Tensor::copy_of(info.name, info.dtype, info.shape, t.contiguous_bytes());
      copy.info().requires_grad = info.requires_grad;
      copy.info().is_parameter = info.is_parameter;
      tensors[refs[k]] = std::move(copy);
    });
    return tensors;
  }

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

  // How many data files are open at once: all of them where the process may open that many
  // (a quarter of the soft RLIMIT_NOFILE, keeping room for the source's files), else a group.
  uint32_t files_per_pass() const {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return files_;
    const uint64_t room = std::max<uint64_t>(16, static_cast<uint64_t>(rl.rlim_cur) / 4);
    return static_cast<uint32_t>(std::min<uint64_t>(files_, room));
  }

  const uint32_t files_;
};

}  // namespace

std::unique_ptr<Writer> make_dcp_writer(const DcpSaveOptions& options) {
  return std::make_unique<DcpWriter>(options);
}

}  // namespace ckpt::internal

namespace ckpt {

void save_dcp(const std::string& dir, const ConstValuePtr& root, const std::vector<Tensor>& tensors,
              const DcpSaveOptions& options) {
  std::unique_ptr<internal::Writer> writer = internal::make_dcp_writer(options);
  internal::WriteContent content;
  content.tensors = tensors;
  content.root = root;
  std::unique_ptr<FolderSink> folder =
      create_folder_sink(dir, FolderSinkOptions{false, options.fsync});
  internal::FolderOutput out(*folder);
  writer->write(out, content);
  out.commit();
}

}  // namespace ckpt
