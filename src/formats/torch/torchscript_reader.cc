// TorchScript archives: constants, code and module-path naming (the public TorchScriptArchive is
// src/api/torchscript_archive.cc).
//
// Layout summary in torchscript_reader.h (records) and debug_pkl.h (debug info); the spec is
// docs/formats/torch.md "TorchScript". Facts this file relies on,
// checked against torch 1.13 output:
// - data.pkl: every module is GLOBAL '__torch__.<qualifier> <Class>', EMPTY_TUPLE, NEWOBJ, then
//   BUILD with a dict of attributes (training, parameters, buffers, submodules...), or with the
//   value its __getstate__ returned. Parameters are plain _rebuild_tensor_v2 tensors
//   (requires_grad=True): only the class's code tells parameters from buffers and attributes.
// - code/<q>.py holds "class <Class>(Module):" blocks whose first lines are
//   `__parameters__ = ["weight", "bias", ]` and `__buffers__ = [...]`.
// - A __setstate__ that restores attributes from a tuple reads `<self>.<attr> = (<arg>)[<i>]`.

#include "formats/torch/torchscript_reader.h"

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <unordered_set>

#include "ckpt/error.h"
#include "formats/torch/debug_pkl.h"

namespace ckpt::internal {
namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// What a class's code says about its attributes.
struct ClassInfo {
  std::set<std::string> params, buffers;
  std::map<int64_t, std::string> setstate;  // state tuple index -> attribute
};

std::vector<std::string> quoted(const std::string& s) {
  std::vector<std::string> out;
  static const std::regex kQuoted("\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), kQuoted); it != std::sregex_iterator();
       ++it)
    out.push_back((*it)[1]);
  return out;
}

size_t indent_of(const std::string& line) {
  size_t i = line.find_first_not_of(' ');
  return i == std::string::npos ? line.size() : i;
}

// Scans one code file for top-level classes (qualifier.Class -> ClassInfo).
void scan_classes(const std::string& qualifier, const std::string& text,
                  std::map<std::string, ClassInfo>& out) {
  static const std::regex kClass(R"(^class ([A-Za-z_][A-Za-z0-9_]*)\b.*)");
  static const std::regex kSetstateHead(
      R"(^\s+def __setstate__\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*:[^,]*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*:)");
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    lines.push_back(text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos));
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  ClassInfo* cur = nullptr;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    std::smatch m;
    if (std::regex_match(l, m, kClass)) {
      cur = &out[qualifier + "." + m[1].str()];
      continue;
    }
    if (!cur || l.empty()) continue;
    if (indent_of(l) == 0) {
      cur = nullptr;
      continue;
    }
    std::string t = l.substr(indent_of(l));
    if (starts_with(t, "__parameters__ = [")) {
      for (auto& n : quoted(t)) cur->params.insert(n);
    } else if (starts_with(t, "__buffers__ = [")) {
      for (auto& n : quoted(t)) cur->buffers.insert(n);
    } else if (starts_with(t, "def __setstate__(")) {
      // The signature may wrap: join lines up to the one that ends the header.
      std::string head = l;
      size_t j = i;
      while (j + 1 < lines.size() && head.find("->") == std::string::npos && head.back() != ':')
        head += " " + lines[++j];
      if (!std::regex_search(head, m, kSetstateHead)) continue;
      std::string self = m[1].str(), arg = m[2].str();
      std::regex assign("^\\s+" + self + "\\.([A-Za-z_][A-Za-z0-9_]*) = \\(" + arg +
                        "\\)\\[(\\d+)\\]\\s*$");
      size_t def_indent = indent_of(l);
      for (size_t k = j + 1; k < lines.size(); ++k) {
        if (!lines[k].empty() && indent_of(lines[k]) <= def_indent) break;
        if (std::regex_match(lines[k], m, assign))
          cur->setstate[std::stoll(m[2].str())] = m[1].str();
      }
      i = j;
    }
  }
}

class Namer {
 public:
  Namer(std::vector<TensorInfo>& tensors, size_t module_tensors,
        const std::map<std::string, ClassInfo>& classes,
        std::vector<std::pair<std::string, size_t>>& state_dict)
      : tensors_(tensors),
        named_(tensors.size(), 0),
        module_tensors_(module_tensors),
        classes_(classes),
        state_dict_(state_dict) {}

  // kind: "param"/"buffer" for a module attribute the code lists, "attribute" for other module
  // attributes, "unknown" for attributes of classes without code, "" elsewhere.
  void walk(const ValuePtr& v, std::string& path, const std::string& kind) {
    if (!v) return;
    auto child = [&](const std::string& comp, const ValuePtr& c, const std::string& k) {
      size_t len = path.size();
      if (!path.empty()) path += '.';
      path += comp;
      walk(c, path, k);
      path.resize(len);
    };
    switch (v->kind()) {
      case Value::Kind::kTensor: {
        size_t i = static_cast<size_t>(v->as_int());
        if (i >= tensors_.size()) return;
        if (tensors_[i].type == "qparams") return;  // part of its quantized tensor
        if (!named_[i]) {
          named_[i] = 1;
          tensors_[i].name = path;
          if (kind == "param" || kind == "buffer") tensors_[i].type = kind;
        }
        if (i < module_tensors_ && (kind == "param" || kind == "buffer" || kind == "unknown"))
          state_dict_.emplace_back(path, i);
        return;
      }
      case Value::Kind::kDict:
      case Value::Kind::kList:
      case Value::Kind::kTuple:
      case Value::Kind::kSet:
      case Value::Kind::kObject:
        break;
      default:
        return;
    }
    // Shared objects are walked under each path (tied modules appear twice in a state dict);
    // cycles are cut, and a budget stops DAGs whose paths multiply (a "billion laughs" pickle).
    if (!on_path_.insert(v.get()).second) return;
    // data.pkl was already walked within Limits::max_pickle_depth; this bound only keeps the
    // recursion finite should that ever change.
    if (on_path_.size() > 10000)
      throw Error(ErrorCode::kLimitExceeded, "module tree nested more than 10000 levels deep");
    if (++visits_ > kMaxVisits)
      throw Error(ErrorCode::kLimitExceeded, "module tree reaches more than " +
                                                 std::to_string(kMaxVisits) +
                                                 " objects through shared references");
    if (v->kind() == Value::Kind::kDict) {
      for (auto& [k, val] : v->entries()) child(k ? path_component(*k) : "?", val, "");
    } else if (v->kind() == Value::Kind::kObject && starts_with(v->module(), "__torch__")) {
      auto ci = classes_.find(v->module() + "." + v->name());
      const ClassInfo* info = ci == classes_.end() ? nullptr : &ci->second;
      auto kind_of = [&](const std::string& attr) -> std::string {
        if (!info) return "unknown";
        if (info->params.count(attr)) return "param";
        if (info->buffers.count(attr)) return "buffer";
        return "attribute";
      };
      const ValuePtr& st = v->state();
      if (st && st->kind() == Value::Kind::kDict) {
        for (auto& [k, val] : st->entries()) {
          std::string attr = k ? path_component(*k) : "?";
          child(attr, val, kind_of(attr));
        }
      } else if (st && st->is_sequence()) {
        for (size_t i = 0; i < st->items().size(); ++i) {
          const std::string* attr = nullptr;
          if (info) {
            auto it = info->setstate.find(static_cast<int64_t>(i));
            if (it != info->setstate.end()) attr = &it->second;
          }
          if (attr) {
            child(*attr, st->items()[i], kind_of(*attr));
          } else {
            child("__state__." + std::to_string(i), st->items()[i], "attribute");
          }
        }
      } else if (st) {
        child("__state__", st, "attribute");
      }
    } else {
      for (size_t i = 0; i < v->items().size(); ++i) child(std::to_string(i), v->items()[i], "");
      if (v->state()) walk(v->state(), path, "");
    }
    on_path_.erase(v.get());
  }

  void finish() {
    for (size_t i = 0; i < tensors_.size(); ++i)
      if (!named_[i]) tensors_[i].name = "<unnamed>." + std::to_string(i);
  }

 private:
  std::vector<TensorInfo>& tensors_;
  std::vector<uint8_t> named_;
  size_t module_tensors_;
  const std::map<std::string, ClassInfo>& classes_;
  std::vector<std::pair<std::string, size_t>>& state_dict_;
  std::unordered_set<const Value*> on_path_;
  static constexpr uint64_t kMaxVisits = 1ull << 24;
  uint64_t visits_ = 0;
};

// Adds `offset` to every tensor index in the tree (each node once: memoized nodes repeat).
void shift_tensors(const ValuePtr& v, size_t offset, std::unordered_set<const Value*>& seen,
                   uint32_t depth, uint32_t max_depth) {
  if (!v || !seen.insert(v.get()).second) return;
  if (depth > max_depth)
    throw Error(ErrorCode::kLimitExceeded, "constants deeper than Limits::max_pickle_depth (" +
                                               std::to_string(max_depth) + ")");
  if (v->kind() == Value::Kind::kTensor) {
    v->set_tensor_index(v->tensor_index() + offset);
    return;
  }
  for (auto& it : v->items()) shift_tensors(it, offset, seen, depth + 1, max_depth);
  for (auto& [k, val] : v->entries()) shift_tensors(val, offset, seen, depth + 1, max_depth);
  if (v->state()) shift_tensors(v->state(), offset, seen, depth + 1, max_depth);
}

}  // namespace

bool safe_relative(std::string_view p) {
  if (p.empty() || p.front() == '/' || p.find('\\') != std::string_view::npos) return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t slash = p.find('/', start);
    std::string_view c = p.substr(start, slash == std::string_view::npos ? p.npos : slash - start);
    if (c.empty() || c == "." || c == "..") return false;
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return true;
}

Bytes read_record(const ZipReader& zip, size_t entry, uint64_t max) {
  const ZipEntry& e = zip.entries()[entry];
  if (e.size > max)
    throw Error(ErrorCode::kLimitExceeded,
                "record is " + std::to_string(e.size) + " bytes; Limits::max_metadata_bytes is " +
                    std::to_string(max),
                zip.source().name(), std::string(e.name));
  return zip.read(entry, /*verify=*/true, max);
}

ValuePtr add_torchscript_constants(const ZipReader& zip, TorchPickle& tp,
                                   const OpenOptions& options) {
  const std::string& prefix = zip.prefix();
  auto entry = zip.find(prefix + "constants.pkl");
  if (!entry)
    throw Error(ErrorCode::kCorrupt, "TorchScript archive (it has code/) without constants.pkl",
                zip.source().name());
  Bytes b = read_record(zip, *entry, options.limits.max_metadata_bytes);
  TorchUnpickleOptions uo;
  uo.source = zip.source().name();
  uo.record = std::string(zip.entries()[*entry].name);
  uo.limits = options.limits;
  uo.file_size = zip.source().size();
  uo.torchscript = true;
  TorchPickle c = unpickle_torch(b.data, uo);
  if (tp.tensors.size() + c.tensors.size() > options.limits.max_tensors)
    throw Error(ErrorCode::kLimitExceeded, "more tensors than Limits::max_tensors", uo.source,
                uo.record);
  size_t storage_base = tp.storages.size(), tensor_base = tp.tensors.size();
  for (StorageInfo& s : c.storages) {
    if (!s.meta) s.record = prefix + "constants/" + s.key;
    s.key = "constants/" + s.key;
    tp.storages.push_back(std::move(s));
  }
  for (TensorInfo& t : c.tensors) {
    t.storage += storage_base;
    if (t.quantization) {
      if (t.quantization->scales_tensor) *t.quantization->scales_tensor += tensor_base;
      if (t.quantization->zero_points_tensor) *t.quantization->zero_points_tensor += tensor_base;
    }
    tp.tensors.push_back(std::move(t));
  }
  std::unordered_set<const Value*> seen;
  shift_tensors(c.root, tensor_base, seen, 0, options.limits.max_pickle_depth);
  return c.root;
}

std::shared_ptr<TorchScriptModel> finish_torchscript(std::shared_ptr<ZipReader> zip,
                                                     CheckpointModel& data, size_t module_tensors,
                                                     ValuePtr constants) {
  auto m = std::make_shared<TorchScriptModel>();
  m->zip = zip;
  m->prefix = zip->prefix();
  m->limits = data.options.limits;
  m->constants = constants;
  const std::string& src = zip->source().name();
  const std::string code_dir = m->prefix + "code/";
  const std::string extra_dir = m->prefix + "extra/";

  // Code files in archive order; debug_pkl records matched to their .py.
  std::map<std::string, size_t> debug_of;
  for (size_t i = 0; i < zip->entries().size(); ++i) {
    const std::string_view n = zip->entries()[i].name;
    if (starts_with(n, extra_dir)) {
      m->extra.emplace_back(std::string(n.substr(extra_dir.size())), i);
      continue;
    }
    if (n == m->prefix + "bytecode.pkl") m->bytecode = true;
    if (!starts_with(n, code_dir)) continue;
    std::string rel(n.substr(code_dir.size()));
    if (!safe_relative(rel))
      throw Error(ErrorCode::kCorrupt, "code record name escapes the archive's code/ folder", src,
                  std::string(n));
    if (ends_with(rel, ".py.debug_pkl")) {
      debug_of[rel.substr(0, rel.size() - 10)] = i;
    } else if (ends_with(rel, ".py")) {
      const ZipEntry& e = zip->entries()[i];
      TorchScriptCodeFile f;
      f.path = rel;
      f.qualifier = rel.substr(0, rel.size() - 3);
      std::replace(f.qualifier.begin(), f.qualifier.end(), '/', '.');
      f.size = e.size;
      f.deflated = e.method != 0;
      m->files.push_back(std::move(f));
      m->code_entry.push_back(i);
    }
  }
  std::map<std::string, ClassInfo> classes;
  uint64_t code_bytes = 0;
  for (size_t k = 0; k < m->files.size(); ++k) {
    auto d = debug_of.find(m->files[k].path);
    m->debug_entry.push_back(d == debug_of.end() ? std::nullopt : std::optional(d->second));
    m->files[k].has_debug = d != debug_of.end();
    Bytes b = read_record(*zip, m->code_entry[k], data.options.limits.max_metadata_bytes);
    code_bytes += b.size();
    if (code_bytes > data.options.limits.max_metadata_bytes)
      throw Error(ErrorCode::kLimitExceeded, "code/ holds more than Limits::max_metadata_bytes",
                  src);
    m->code_text.emplace_back(b.str());
    scan_classes(m->files[k].qualifier, m->code_text.back(), classes);
  }

  // Names: module tensors by path, then the constants. A per-channel quantized tensor's scales
  // and zero points ("qparams", set by the unpickler) stay part of their tensor: never listed,
  // never in the state dict, whatever the walk reaches.
  auto qparams = [&](size_t i) { return data.tensors[i].type == "qparams"; };
  for (size_t i = 0; i < data.tensors.size(); ++i) {
    data.tensors[i].name.clear();
    if (!qparams(i)) data.tensors[i].type.clear();
  }
  Namer namer(data.tensors, module_tensors, classes, m->state_dict);
  std::string path;
  namer.walk(data.root, path, "");
  if (constants && constants->is_sequence()) {
    path = "constants";
    for (size_t i = 0; i < constants->items().size(); ++i) {
      std::string p = path + "." + std::to_string(i);
      namer.walk(constants->items()[i], p, "");
    }
  }
  namer.finish();
  for (size_t i = module_tensors; i < data.tensors.size(); ++i)
    if (!qparams(i)) data.tensors[i].type = "constant";

  data.properties["code_files"] = std::to_string(m->files.size());
  data.properties["debug_files"] = std::to_string(debug_of.size());
  data.properties["constants"] =
      std::to_string(constants && constants->is_sequence() ? constants->items().size() : 0);
  if (!m->extra.empty()) {
    std::string names;
    for (auto& [n, i] : m->extra) names += (names.empty() ? "" : ",") + n;
    data.properties["extra_files"] = names;
  }
  if (m->bytecode) data.properties["bytecode"] = "present (mobile, _save_for_lite_interpreter)";
  return m;
}

}  // namespace ckpt::internal
