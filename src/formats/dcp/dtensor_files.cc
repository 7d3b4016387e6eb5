// A folder of per-rank torch.save files of DTensors, assembled (formats/dcp/dtensor_files.h).

#include "formats/dcp/dtensor_files.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>

#include "ckpt/error.h"
#include "formats/dcp/dcp_checks.h"
#include "formats/dcp/dcp_layout.h"
#include "formats/open.h"
#include "io/inside.h"

namespace ckpt::internal {
namespace {

const std::regex& rank_file() {
  static const std::regex re(R"(model_world_size_([0-9]{1,6})_rank_([0-9]{1,6})\.pt)");
  return re;
}

std::string join(const std::string& dir, const std::string& name) {
  return !dir.empty() && dir.back() == '/' ? dir + name : dir + "/" + name;
}

// An attribute of a pickled object: BUILD state (a dict, or copyreg's (dict, slots) pair) or the
// keys set on it.
ValuePtr field(const ValuePtr& obj, const char* name) {
  if (!obj) return nullptr;
  if (obj->kind() == Value::Kind::kTuple) {
    for (const ValuePtr& part : obj->items())
      if (part && part->is_dict())
        if (ValuePtr v = part->get(name)) return v;
    return nullptr;
  }
  if (obj->state() && obj->state()->kind() == Value::Kind::kTuple) return field(obj->state(), name);
  if (obj->state() && obj->state()->is_dict()) return obj->state()->get(name);
  if (obj->is_dict()) return obj->get(name);
  for (const auto& [k, v] : obj->entries())
    if (k && k->kind() == Value::Kind::kString && k->str() == name) return v;
  return nullptr;
}

// Ints of a tuple, a list or a torch.Size object (its one argument); nullopt otherwise.
std::optional<std::vector<int64_t>> ints(const ValuePtr& v) {
  if (!v) return std::nullopt;
  if (v->kind() == Value::Kind::kObject && v->items().size() == 1) return ints(v->items()[0]);
  if (!v->is_sequence()) return std::nullopt;
  std::vector<int64_t> out;
  for (const ValuePtr& x : v->items()) {
    if (!x || x->kind() != Value::Kind::kInt || x->is_big_int()) return std::nullopt;
    out.push_back(x->as_int());
  }
  return out;
}

// One rank's value of a key: its box in the global tensor.
struct Box {
  std::vector<int64_t> global, offsets, sizes;
};

class Assembler {
 public:
  Assembler(std::string dir, const OpenOptions& options) : options_(options) {
    layout_ = std::make_shared<DcpLayout>();
    layout_->dir = std::move(dir);
  }

  std::shared_ptr<CheckpointModel> open() {
    open_files();
    auto model = std::make_shared<CheckpointModel>();
    model->format = Format::kTorchDcp;
    model->source = layout_->sources[0];
    model->options = options_;
    model->root = Value::ordered_dict();
    const ValuePtr& root0 = ranks_[0]->root;
    if (!root0 || !root0->is_dict())
      fail(ErrorCode::kUnsupported, "the file is not a state dict", 0, {});
    for (const auto& [k, v] : root0->entries()) {
      if (!k || k->kind() != Value::Kind::kString)
        fail(ErrorCode::kUnsupported, "a key that is not a string", 0, {});
      add(*model, k->str());
    }
    model->decoder = dcp_decoder(layout_);
    model->decode_all = true;
    model->files = layout_->paths;
    model->verify = [](const ProgressFn& progress) -> size_t {
      if (progress) progress(0, 0);
      return 0;
    };
    model->properties["data_files"] = std::to_string(layout_->paths.size());
    model->properties["dcp_layout"] = "per-rank torch.save files of DTensors";
    model->finalize();
    return model;
  }

 private:
  [[noreturn]] void fail(ErrorCode code, const std::string& what, size_t rank,
                         const std::string& key) const {
    throw Error(code, what, layout_->paths.empty() ? layout_->dir : layout_->paths[rank], key);
  }

  void open_files() {
    std::map<uint64_t, std::map<uint64_t, std::string>> sets;  // world size -> rank -> name
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(layout_->dir, ec)) {
      const std::string name = f.path().filename().string();
      std::smatch m;
      if (std::regex_match(name, m, rank_file()))
        sets[std::stoull(m[1].str())][std::stoull(m[2].str())] = name;
    }
    if (sets.size() != 1)
      throw Error(ErrorCode::kNotFound,
                  sets.empty() ? "no model_world_size_<N>_rank_<R>.pt files"
                               : "model_world_size_<N>_rank_<R>.pt files of several world sizes",
                  layout_->dir);
    const auto& [world, files] = *sets.begin();
    for (uint64_t r = 0; r < world; ++r) {
      const std::string name =
          "model_world_size_" + std::to_string(world) + "_rank_" + std::to_string(r) + ".pt";
      const std::string path = join(layout_->dir, name);
      if (!files.count(r))
        throw Error(ErrorCode::kNotFound, "rank " + std::to_string(r) + "'s file is missing", path);
      check_inside(path, layout_->dir, "file", "the folder", path, {});
      SourcePtr s = open_file_source(path);
      ranks_.push_back(open_model(s, options_));
      layout_->sources.push_back(s);
      layout_->paths.push_back(s->name());
    }
  }

  // The box rank r's value of `key` fills, from its DTensorSpec (a plain tensor: all of it).
  Box box_of(size_t r, const std::string& key, const TensorInfo& t, const ValuePtr& v) const {
    Box b;
    const ValuePtr& origin = v->origin();
    const bool dtensor = origin && origin->items().size() == 2 && origin->items()[0] &&
                         origin->items()[0]->name() == "DTensor";
    if (!dtensor) {
      b.global = b.sizes = t.shape;
      b.offsets.assign(t.shape.size(), 0);
      return b;
    }
    const ValuePtr spec = field(origin->items()[1], "_spec");
    const ValuePtr meta = field(spec, "tensor_meta");
    const ValuePtr placements = field(spec, "placements");
    std::optional<std::vector<int64_t>> global =
        meta && !meta->items().empty() ? ints(meta->items()[0]) : std::nullopt;
    if (!global || global->size() != t.shape.size() || !placements || !placements->is_sequence())
      fail(ErrorCode::kUnsupported, "a DTensor whose spec is not read (tensor_meta, placements)", r,
           key);
    if (placements->items().size() != 1)
      fail(ErrorCode::kUnsupported,
           "a DTensor on a " + std::to_string(placements->items().size()) +
               "-D mesh (only 1-D meshes over the files' ranks are assembled)",
           r, key);
    if (std::any_of(global->begin(), global->end(), [](int64_t s) { return s < 0; }))
      fail(ErrorCode::kCorrupt, "a negative size in the DTensor's global shape", r, key);
    b.global = *global;
    b.offsets.assign(b.global.size(), 0);
    b.sizes = b.global;
    const ValuePtr& p = placements->items()[0];
    const std::string kind = p ? p->name() : "";
    if (kind == "Replicate") return b;
    if (kind != "Shard")
      fail(ErrorCode::kUnsupported,
           "a DTensor placed as " + kind + " (Shard and Replicate are read)", r, key);
    const ValuePtr dim = field(p, "dim");
    if (!dim || dim->kind() != Value::Kind::kInt || dim->as_int() < 0 ||
        static_cast<size_t>(dim->as_int()) >= b.global.size())
      fail(ErrorCode::kCorrupt, "Shard's dim is not a dimension of the tensor", r, key);
    std::optional<std::vector<int64_t>> coord =
        ints(field(field(spec, "mesh"), "_coordinate_on_dim"));
    const int64_t n = static_cast<int64_t>(ranks_.size());
    const int64_t c = coord && coord->size() == 1 ? (*coord)[0] : static_cast<int64_t>(r);
    const size_t d = static_cast<size_t>(dim->as_int());
    const int64_t size = b.global[d], chunk = (size + n - 1) / n;
    b.offsets[d] = std::min(c * chunk, size);
    b.sizes[d] = std::max<int64_t>(0, std::min(size, b.offsets[d] + chunk) - b.offsets[d]);
    return b;
  }

  void add(CheckpointModel& m, const std::string& key) {
    DcpEntry e;
    e.fqn = key;
    std::vector<DcpPiece> pieces;
    std::vector<uint32_t> files;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const CheckpointModel& rm = *ranks_[r];
      ValuePtr v = rm.root && rm.root->is_dict() ? rm.root->get(key) : nullptr;
      if (!v || v->kind() != Value::Kind::kTensor || v->tensor_index() >= rm.tensors.size())
        fail(ErrorCode::kCorrupt, "the key is not a tensor in this rank's file", r, key);
      const TensorInfo& t = rm.tensors[v->tensor_index()];
      Box b = box_of(r, key, t, v);
      if (r == 0) {
        e.dtype = t.dtype;
        e.size = b.global;
      } else if (t.dtype != e.dtype || b.global != e.size) {
        fail(ErrorCode::kCorrupt, "the ranks disagree on the tensor's dtype or global shape", r,
             key);
      }
      if (t.shape != b.sizes)
        fail(ErrorCode::kCorrupt, "the rank's shard is not the box its placement gives it", r, key);
      uint64_t vol = 1;
      for (int64_t s : b.sizes) vol *= static_cast<uint64_t>(s);
      const bool dup = std::any_of(e.chunks.begin(), e.chunks.end(), [&](const DcpChunk& c) {
        return c.offsets == b.offsets && c.sizes == b.sizes;
      });
      if (dup) continue;  // a replicated value: the lowest rank's
      e.chunks.push_back({b.offsets, b.sizes});
      if (!vol) continue;
      const StorageInfo& st = rm.storages[t.storage];
      if (!t.is_contiguous() || rm.kind(t.storage) != StorageKind::kRaw || st.byteswap)
        fail(ErrorCode::kUnsupported,
             "the shard is not stored as contiguous raw bytes in native order", r, key);
      DcpPiece piece;
      piece.file = static_cast<uint32_t>(r);
      piece.file_offset = st.offset + t.byte_offset();
      piece.nbytes = t.nbytes();
      piece.shape = e.size;
      piece.offsets = b.offsets;
      piece.sizes = b.sizes;
      files.push_back(piece.file);
      pieces.push_back(std::move(piece));
    }
    check_tiling(e, [&](ErrorCode code, const std::string& what, const DcpChunk*) {
      fail(code, what, 0, key);
    });
    StorageInfo si;
    si.key = si.record = key;
    si.dtype = e.dtype;
    uint64_t numel = 1;
    for (int64_t s : e.size) {
      if (s && numel > UINT64_MAX / 16 / static_cast<uint64_t>(s))
        fail(ErrorCode::kCorrupt, "the tensor's size overflows", 0, key);
      numel *= static_cast<uint64_t>(s);
    }
    si.nbytes = numel * dtype_size(e.dtype);
    if (pieces.empty()) si.meta = numel != 0;
    TensorInfo t;
    t.name = key;
    t.dtype = e.dtype;
    t.shape = e.size;
    t.strides = contiguous_strides(e.size);
    t.storage = m.storages.size();
    m.storages.push_back(std::move(si));
    layout_->pieces.push_back(std::move(pieces));
    if (files.empty()) files.push_back(0);
    m.tensor_files.push_back(std::move(files));
    m.tensors.push_back(std::move(t));
    m.root->entries().emplace_back(Value::string(key), Value::tensor(m.tensors.size() - 1));
  }

  OpenOptions options_;
  std::shared_ptr<DcpLayout> layout_;
  std::vector<std::shared_ptr<CheckpointModel>> ranks_;
};

}  // namespace

bool has_dtensor_files(const std::string& dir) {
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, rank_file()) && m[2].str() == "0") return true;
  }
  return false;
}

std::shared_ptr<CheckpointModel> open_dtensor_files(const std::string& dir,
                                                    const OpenOptions& options) {
  return Assembler(dir, options).open();
}

}  // namespace ckpt::internal
