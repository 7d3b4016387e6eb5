// ckpt extract FILE DIR [--force] [--meta zeros|skip]: one .npy per tensor plus index.json. dtypes
// numpy lacks are written as their raw bit pattern (an unsigned or signed integer of the same
// width), said in the index. The folder appears whole or not at all (ckpt::create_folder_sink):
// written into a temporary sibling, index.json last, then renamed into place; a non-empty DIR is
// refused unless
// --force, which replaces it whole.

#include <cctype>
#include <cstdio>
#include <cstring>
#include <set>

#include "common.h"
#include "progress.h"

namespace ckpt::cli {
namespace {

// The .npy descr for a dtype, and whether it is the raw bit pattern.
std::pair<std::string, bool> npy_descr(DType d) {
  const auto& info = dtype_info(d);
  if (info.numpy) return {info.numpy, false};
  switch (d) {
    case DType::kQInt8:
      return {"|i1", true};
    case DType::kQInt32:
      return {"<i4", true};
    default:
      break;
  }
  switch (info.bits) {
    case 16:
      return {"<u2", true};
    case 32:
      return {"<u4", true};
    case 64:
      return {"<u8", true};
    default:
      return {"|u1", true};
  }
}

std::string npy_header(const std::string& descr, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) dict += std::to_string(shape[i]) + ", ";
  if (shape.size() > 1) dict.resize(dict.size() - 2);
  if (shape.size() == 1) dict.resize(dict.size() - 1);
  dict += "), }";
  size_t total = 10 + dict.size() + 1;
  size_t pad = (64 - total % 64) % 64;
  dict.append(pad, ' ');
  dict += '\n';
  std::string h = "\x93NUMPY";
  h += '\x01';
  h += '\x00';
  h += static_cast<char>(dict.size() & 0xff);
  h += static_cast<char>(dict.size() >> 8);
  return h + dict;
}

template <typename T>
T load_value(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A small tensor's elements as JSON numbers (per-channel scales and zero points).
nlohmann::ordered_json json_values(const Tensor& t) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  auto bytes = t.contiguous_bytes();
  const size_t es = dtype_size(t.info().dtype);
  for (uint64_t i = 0; es && i < t.info().numel(); ++i) {
    const std::byte* p = bytes.data() + i * es;
    switch (t.info().dtype) {
      case DType::kFloat64:
        out.push_back(load_value<double>(p));
        break;
      case DType::kFloat32:
        out.push_back(load_value<float>(p));
        break;
      case DType::kInt64:
        out.push_back(load_value<int64_t>(p));
        break;
      case DType::kInt32:
        out.push_back(load_value<int32_t>(p));
        break;
      default:
        out.push_back(nullptr);
        break;
    }
  }
  return out;
}

// A file name for a tensor name (index.json holds the real one). A file name has at most 255
// bytes: a longer name keeps its first 180 and a hash of the whole (FNV-1a), leaving room for
// the "~N" that tells equal ones apart and ".npy".
std::string safe_name(const std::string& name) {
  std::string s;
  for (char ch : name)
    s += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-')
             ? ch
             : '_';
  if (s.empty() || s[0] == '.') s = "_" + s;
  if (s.size() > 200) {
    uint64_t h = 14695981039346656037ull;
    for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
    char hex[24];
    std::snprintf(hex, sizeof hex, "~%016llx", static_cast<unsigned long long>(h));
    s = s.substr(0, 180) + hex;
  }
  return s;
}

struct ExtractOptions {
  std::vector<std::string> files;  // one checkpoint, an index, or shards
  std::string file, dir, meta;
  bool force = false;
  Common common;
  ProgressMode progress = ProgressMode::kAuto;
};

// (name, tensor index): every listed tensor, or a TorchScript module's state dict (parameters and
// buffers by module path; constants are part of the code, not the state). Meta tensors are
// refused without --meta, left out with --meta=skip; `metas` counts them.
std::vector<std::pair<std::string, size_t>> items_to_extract(const ExtractOptions& o,
                                                             const Checkpoint& c, size_t& metas) {
  std::vector<std::pair<std::string, size_t>> items;
  if (format_traits(c.format()).script) {
    items = TorchScriptArchive::from(c).state_dict();
  } else {
    for (size_t i = 0; i < c.tensors().size(); ++i)
      if (listed(c.tensors()[i])) items.emplace_back(c.tensors()[i].name, i);
  }
  // A meta tensor has no bytes: .npy has no way to say so, and zeros would be invented.
  auto is_meta = [&](size_t i) { return c.storages()[c.tensors()[i].storage].meta; };
  for (const auto& [name, i] : items) {
    if (!is_meta(i)) continue;
    if (o.meta.empty())
      throw Error(ErrorCode::kUnsupported,
                  "is a meta tensor (a dtype and shape without bytes); .npy cannot say so: "
                  "--meta=zeros writes zeros, --meta=skip leaves it out",
                  o.file, name);
    ++metas;
  }
  if (o.meta == "skip")
    std::erase_if(items, [&](const auto& item) { return is_meta(item.second); });
  return items;
}

// DIR, written into a temporary sibling and renamed into place on commit.
std::unique_ptr<FolderSink> open_output(const ExtractOptions& o) {
  try {
    return create_folder_sink(o.dir, {.replace = o.force});
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidArgument || o.force ||
        e.message().find("not empty") == std::string::npos)
      throw;
    throw Error(e.code(), e.message() + "; --force replaces it whole", o.dir);
  }
}

// The index.json entry of one tensor.
nlohmann::ordered_json index_entry(const Checkpoint& c, const TensorInfo& info,
                                   const std::string& file, const std::string& descr, bool raw,
                                   bool meta) {
  nlohmann::ordered_json r;
  r["name"] = info.name;
  r["file"] = file;
  r["dtype"] = dtype_name(info.dtype);
  r["shape"] = info.shape;
  r["numpy_dtype"] = descr;
  r["raw_bits"] = raw;
  if (meta) r["meta"] = true;  // written as zeros (--meta=zeros)
  if (info.quantization) {
    const Quantization& q = *info.quantization;
    r["qscheme"] = q.scheme;
    if (q.scales_tensor && q.zero_points_tensor) {
      // Per channel: the scales and zero points along `axis`, from their own tensors.
      r["scales"] = json_values(c.tensor(*q.scales_tensor));
      r["zero_points"] = json_values(c.tensor(*q.zero_points_tensor));
      r["axis"] = q.axis;
    } else {
      r["scale"] = q.scale;
      r["zero_point"] = q.zero_point;
    }
  }
  return r;
}

void run_extract(ExtractOptions& o) {
  if (o.dir.empty()) {
    if (o.files.size() < 2) {
      std::fprintf(stderr, "ckpt: DIR is required (see ckpt --help)\n");
      throw ExitStatus{kUsageExit};
    }
    o.dir = o.files.back();
    o.files.pop_back();
  }
  o.file = files_name(o.files);
  Checkpoint c = open_checkpoint(o.files, o.common);
  auto is_meta = [&](size_t i) { return c.storages()[c.tensors()[i].storage].meta; };
  size_t metas = 0;
  std::vector<std::pair<std::string, size_t>> items = items_to_extract(o, c, metas);
  std::unique_ptr<FolderSink> out = open_output(o);
  nlohmann::ordered_json index;
  index["format"] = format_name(c.format());
  index["source"] = o.file;
  index["tensors"] = nlohmann::ordered_json::array();
  std::set<std::string> used;
  uint64_t total = 0;
  uint64_t planned = 0;
  for (const auto& item : items) planned += c.tensors()[item.second].nbytes();
  ProgressLine line(o.progress);
  for (const auto& [name, i] : items) {
    TensorInfo info = c.tensors()[i];
    info.name = name;
    Tensor t = c.tensor(i);
    auto [descr, raw] = npy_descr(info.dtype);
    std::string file = safe_name(info.name);
    for (int k = 2; used.count(file); ++k) file = safe_name(info.name) + "~" + std::to_string(k);
    used.insert(file);
    file += ".npy";
    std::vector<int64_t> shape = info.shape;
    if (dtype_size(info.dtype) == 0) shape = {static_cast<int64_t>(info.nbytes())};
    auto bytes = t.contiguous_bytes();
    auto sink = out->create(file);
    sink->write(npy_header(descr, shape));
    sink->write(bytes);
    sink->commit();
    total += bytes.size();
    line.update(total, planned);
    index["tensors"].push_back(index_entry(c, info, file, descr, raw, is_meta(i)));
  }
  auto sink = out->create("index.json");
  sink->write(index.dump(1) + "\n");
  sink->commit();
  out->commit();
  line.finish(total);
  std::printf("wrote %zu tensors (%s) to %s\n", index["tensors"].size(), human_bytes(total).c_str(),
              o.dir.c_str());
  if (metas)
    std::fprintf(stderr, "ckpt: note: %zu meta tensors (no bytes) %s\n", metas,
                 o.meta == "skip" ? "left out" : "written as zeros");
}

}  // namespace

void add_extract(CLI::App& app) {
  auto o = std::make_shared<ExtractOptions>();
  auto* cmd = app.add_subcommand("extract", "write one .npy per tensor and index.json");
  cmd->add_option("FILE", o->files, "checkpoint, shard index, or shard files")->required();
  // FILE takes every argument (several shard files); the last one is DIR.
  cmd->add_option("DIR", o->dir, "output folder (created with its parents; must be empty)");
  cmd->add_flag("--force", o->force, "replace DIR whole when it exists and is not empty");
  cmd->add_option("--meta", o->meta,
                  "meta tensors (no bytes): write zeros, or skip them; without it they are "
                  "refused")
      ->check(CLI::IsMember({"zeros", "skip"}));
  add_common(*cmd, o->common);
  add_progress_flags(*cmd, o->progress);
  cmd->callback([o] { run_extract(*o); });
}

}  // namespace ckpt::cli
