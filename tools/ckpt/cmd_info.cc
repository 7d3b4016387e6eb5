// ckpt info FILE [--json]: format, version, records, alignment, tensor totals, non-tensor summary.

#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "common.h"

namespace ckpt::cli {
namespace {

void count_values(const ConstValuePtr& v, std::map<std::string, size_t>& kinds,
                  std::map<std::string, size_t>& foreign, std::set<const Value*>& seen, int depth) {
  if (!v || depth > 200 || !seen.insert(v.get()).second) return;
  if (v->foreign()) foreign[v->module() + "." + v->name()]++;
  auto count_values = [&](const ConstValuePtr& c, auto&, auto&, int d) {
    ckpt::cli::count_values(c, kinds, foreign, seen, d);
  };
  switch (v->kind()) {
    case Value::Kind::kTensor:
      // A tensor subclass or a tensor with attributes: its class and its attributes' values.
      if (auto& o = v->origin();
          o && o->kind() == Value::Kind::kObject && o->items().size() == 2 &&
          (o->name() == "_rebuild_from_type_v2" || o->name() == "_rebuild_parameter_with_state")) {
        if (auto& cls = o->items()[0]; cls && cls->foreign())
          foreign[cls->module() + "." + cls->name()]++;
        count_values(o->items()[1], kinds, seen, depth + 1);
      }
      return;
    case Value::Kind::kDict:
      kinds[v->name().empty() ? "dict" : v->name()]++;
      for (auto& [k, val] : v->entries()) count_values(val, kinds, seen, depth + 1);
      return;
    case Value::Kind::kList:
      kinds["list"]++;
      break;
    case Value::Kind::kTuple:
      kinds["tuple"]++;
      break;
    case Value::Kind::kSet:
      kinds["set"]++;
      break;
    case Value::Kind::kObject:
      kinds[v->module() + "." + v->name()]++;
      break;
    case Value::Kind::kNone:
      kinds["None"]++;
      return;
    case Value::Kind::kBool:
      kinds["bool"]++;
      return;
    case Value::Kind::kInt:
      kinds["int"]++;
      return;
    case Value::Kind::kFloat:
      kinds["float"]++;
      return;
    case Value::Kind::kString:
      kinds["str"]++;
      return;
    case Value::Kind::kBytes:
      kinds["bytes"]++;
      return;
    default:
      kinds[v->repr(30)]++;
      return;
  }
  for (auto& it : v->items()) count_values(it, kinds, seen, depth + 1);
  for (auto& it : v->appended()) count_values(it, kinds, seen, depth + 1);
  for (auto& [k, val] : v->entries()) count_values(val, kinds, seen, depth + 1);
  if (v->state()) count_values(v->state(), kinds, seen, depth + 1);
}

// A top-level value worth printing beside the counts (epoch, step, best_acc, a short name): a
// scalar, a short string, or a short list or tuple of scalars. nullopt for anything else.
std::optional<nlohmann::ordered_json> top_level_scalar(const ConstValuePtr& v) {
  if (!v) return nlohmann::ordered_json(nullptr);
  switch (v->kind()) {
    case Value::Kind::kNone:
      return nlohmann::ordered_json(nullptr);
    case Value::Kind::kBool:
      return nlohmann::ordered_json(v->as_bool());
    case Value::Kind::kInt:
      if (v->is_big_int()) return nlohmann::ordered_json(v->str());
      return nlohmann::ordered_json(v->as_int());
    case Value::Kind::kFloat:
      if (!std::isfinite(v->as_float())) return nlohmann::ordered_json(v->repr(40));
      return nlohmann::ordered_json(v->as_float());
    case Value::Kind::kString:
      if (v->str().size() > 80) return std::nullopt;
      return nlohmann::ordered_json(v->str());
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      if (v->items().size() > 8) return std::nullopt;
      auto arr = nlohmann::ordered_json::array();
      for (const auto& it : v->items()) {
        if (it && (it->kind() == Value::Kind::kList || it->kind() == Value::Kind::kTuple))
          return std::nullopt;
        auto x = top_level_scalar(it);
        if (!x) return std::nullopt;
        arr.push_back(*x);
      }
      return arr;
    }
    default:
      return std::nullopt;
  }
}

struct InfoOptions {
  std::vector<std::string> files;  // one checkpoint, an index, or shards
  std::string file;
  bool json = false;
  Common common;
};

// What `info` reports of an open checkpoint.
struct InfoFacts {
  uint64_t tensor_bytes = 0, storage_bytes = 0;
  size_t count = 0;
  std::map<std::string, std::pair<size_t, uint64_t>> by_dtype;
  std::map<std::string, size_t> kinds, foreign;
  // The top level's scalars (a training checkpoint's epoch, step, best metric...), as values.
  nlohmann::ordered_json top = nlohmann::ordered_json::object();
  std::vector<std::pair<std::string, std::string>> top_text;
};

InfoFacts gather(const Checkpoint& c) {
  InfoFacts f;
  for (const TensorInfo& t : c.tensors()) {
    if (!listed(t)) continue;
    ++f.count;
    f.tensor_bytes += t.nbytes();
    auto& d = f.by_dtype[std::string(dtype_name(t.dtype))];
    d.first++;
    d.second += t.nbytes();
  }
  for (const StorageInfo& s : c.storages()) f.storage_bytes += s.nbytes;
  std::set<const Value*> seen;
  count_values(c.root(), f.kinds, f.foreign, seen, 0);
  if (c.root() && c.root()->kind() == Value::Kind::kDict) {
    for (const auto& [k, val] : c.root()->entries()) {
      if (!k || (val && val->kind() == Value::Kind::kTensor)) continue;
      if (auto x = top_level_scalar(val)) {
        const std::string name = path_component(*k);
        f.top[name] = *x;
        f.top_text.emplace_back(name, val ? val->repr(100) : "None");
      }
    }
  }
  return f;
}

void print_json(const InfoOptions& o, const Checkpoint& c, const InfoFacts& f, double open_s) {
  nlohmann::ordered_json j;
  j["file"] = o.file;
  j["format"] = format_name(c.format());
  j["file_bytes"] = c.source().size();
  for (auto& [k, v] : c.properties()) j["properties"][k] = v;
  j["records"] = c.records().size();
  j["tensors"] = f.count;
  j["tensor_bytes"] = f.tensor_bytes;
  j["storages"] = c.storages().size();
  j["storage_bytes"] = f.storage_bytes;
  for (auto& [k, v] : f.by_dtype) j["dtypes"][k] = {{"tensors", v.first}, {"bytes", v.second}};
  for (auto& [k, v] : f.kinds) j["values"][k] = v;
  // Classes and functions ckpt does not know, kept as opaque objects (never called).
  j["foreign_classes"] = nlohmann::ordered_json::object();
  for (auto& [k, v] : f.foreign) j["foreign_classes"][k] = v;
  j["top_level_values"] = f.top;
  j["open_seconds"] = open_s;
  std::printf("%s\n", j.dump(1).c_str());
}

void print_text(const InfoOptions& o, const Checkpoint& c, const InfoFacts& f, double open_s) {
  std::printf("file:      %s (%s)\n", printable(o.file).c_str(),
              human_bytes(c.source().size()).c_str());
  std::printf("format:    %s\n", format_name(c.format()));
  for (auto& [k, v] : c.properties())
    std::printf("  %-16s %s\n", printable(k + ":").c_str(), printable(v).c_str());
  std::printf("records:   %zu\n", c.records().size());
  std::printf("tensors:   %zu (%s), storages: %zu (%s)\n", f.count,
              human_bytes(f.tensor_bytes).c_str(), c.storages().size(),
              human_bytes(f.storage_bytes).c_str());
  for (auto& [k, v] : f.by_dtype)
    std::printf("  %-16s %zu tensors, %s\n", printable(k).c_str(), v.first,
                human_bytes(v.second).c_str());
  if (!f.top_text.empty()) {
    std::printf("top-level values:\n");
    for (auto& [k, v] : f.top_text)
      std::printf("  %-30s %s\n", printable(k + ":").c_str(), printable(v).c_str());
  }
  if (!f.kinds.empty()) {
    std::printf("non-tensor values:\n");
    for (auto& [k, v] : f.kinds) std::printf("  %-30s %zu\n", printable(k).c_str(), v);
  }
  if (!f.foreign.empty()) {
    std::printf("foreign classes (kept as opaque objects, never called):\n");
    for (auto& [k, v] : f.foreign) std::printf("  %-30s %zu\n", printable(k).c_str(), v);
  }
  std::printf("opened in %.3f ms\n", open_s * 1e3);
}

void run_info(InfoOptions& o) {
  o.file = files_name(o.files);
  double t0 = now_seconds();
  Checkpoint c = open_checkpoint(o.files, o.common);
  double open_s = now_seconds() - t0;
  const InfoFacts f = gather(c);
  if (o.json)
    print_json(o, c, f, open_s);
  else
    print_text(o, c, f, open_s);
  keep_until_exit(std::move(c));
}

}  // namespace

void add_info(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  auto* cmd = app.add_subcommand("info", "format, version, records, tensor totals");
  cmd->add_option("FILE", o->files, "checkpoint, shard index, or shard files")->required();
  cmd->add_flag("--json", o->json, "machine-readable output");
  add_common(*cmd, o->common);
  cmd->callback([o] { run_info(*o); });
}

}  // namespace ckpt::cli
