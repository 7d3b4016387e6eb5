// TorchScriptArchive: the public view of a TorchScript archive over the model that the torch
// reader keeps (formats/torch/torchscript_reader.h).

#include <algorithm>
#include <cctype>
#include <string_view>

#include "api/checkpoint_impl.h"
#include "ckpt/torchscript.h"
#include "formats/torch/debug_pkl.h"
#include "formats/torch/torchscript_reader.h"

namespace ckpt {

using internal::TorchScriptModel;

namespace {
// Names of the top-level classes and functions of stored source ("class A(Module):", "def f(").
std::vector<std::string> top_level_names(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view l(text.data() + pos, (nl == std::string::npos ? text.size() : nl) - pos);
    for (std::string_view kw : {"class ", "def "}) {
      if (!l.starts_with(kw)) continue;
      std::string_view rest = l.substr(kw.size());
      size_t end = rest.find_first_of("(:");
      if (end != std::string_view::npos && end > 0) out.emplace_back(rest.substr(0, end));
    }
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  return out;
}

// Where the expression of a stored statement starts: after `return ` or after the targets of an
// assignment (`a = `, `a, b = `, `self.x = `); 0 for any other line.
size_t expression_start(std::string_view l) {
  size_t i = 0;
  if (l.starts_with("return ")) {
    i = 7;
  } else {
    while (i < l.size() && (std::isalnum(static_cast<unsigned char>(l[i])) || l[i] == '_' ||
                            l[i] == '.' || l[i] == ',' || l[i] == ' '))
      ++i;
    if (i == 0 || i + 1 >= l.size() || l[i] != '=' || l[i + 1] == '=') return 0;
    ++i;
  }
  while (i < l.size() && l[i] == ' ') ++i;
  return i < l.size() ? i : 0;
}
}  // namespace

TorchScriptArchive TorchScriptArchive::open(const std::string& path, const OpenOptions& options) {
  return from(Checkpoint::open(path, options));
}

TorchScriptArchive TorchScriptArchive::from(const Checkpoint& c) {
  auto m = std::dynamic_pointer_cast<const TorchScriptModel>(
      internal::CheckpointAccess::model(c).extension);
  if (!format_traits(c.format()).script || !m)
    throw Error(ErrorCode::kInvalidArgument,
                std::string("not a TorchScript archive (format ") + format_name(c.format()) +
                    "; TorchScript archives have constants.pkl and code/)",
                c.source().name());
  return TorchScriptArchive(c, std::move(m));
}

TorchScriptRewriteReport TorchScriptArchive::rewrite(
    const std::string& path, const TorchScriptRewriteOptions& options) const {
  return internal::rewrite_torchscript(*model_, path, options);
}

const ValuePtr& TorchScriptArchive::constants() const { return model_->constants; }
const std::vector<TorchScriptCodeFile>& TorchScriptArchive::code_files() const {
  return model_->files;
}
bool TorchScriptArchive::has_bytecode() const { return model_->bytecode; }
const std::vector<std::pair<std::string, size_t>>& TorchScriptArchive::state_dict() const {
  return model_->state_dict;
}

const TorchScriptCodeFile& TorchScriptArchive::find_code(std::string_view name) const {
  const auto& files = model_->files;
  std::string n(name);
  const std::string& src = checkpoint_.source().name();
  if (n.empty()) throw Error(ErrorCode::kInvalidArgument, "empty code name", src);
  bool is_path = n.find('/') != std::string::npos || n.ends_with(".py");
  if (is_path) {
    if (!internal::safe_relative(n))
      throw Error(ErrorCode::kInvalidArgument,
                  "code path '" + n + "' leaves the archive folder (absolute, '..', '.' or '\\')",
                  src);
    std::string folder = model_->prefix;
    if (!folder.empty() && n.starts_with(folder)) n = n.substr(folder.size());
    if (n.starts_with("code/")) n = n.substr(5);
    for (const auto& f : files)
      if (f.path == n) return f;
  } else {
    // A qualified name: a module qualifier, or the longest qualifier that prefixes it followed by
    // a class or function that file defines ("a.b.C" -> file for "a.b", if it defines C).
    std::string q = n;
    while (true) {
      for (size_t k = 0; k < files.size(); ++k) {
        const auto& f = files[k];
        if (f.qualifier != q) continue;
        if (q.size() == n.size()) return f;
        const std::string rest = n.substr(q.size() + 1);
        const auto defined = top_level_names(model_->code_text[k]);
        if (std::find(defined.begin(), defined.end(), rest) != defined.end()) return f;
        std::string list;
        for (size_t i = 0; i < defined.size() && i < 8; ++i) list += (i ? ", " : "") + defined[i];
        if (defined.size() > 8) list += ", ...";
        throw Error(ErrorCode::kNotFound,
                    "no class or function '" + rest + "' in code/" + f.path + " (" + q +
                        (defined.empty() ? " defines none)" : " defines " + list + ")"),
                    src);
      }
      auto dot = q.rfind('.');
      if (dot == std::string::npos) break;
      q.resize(dot);
    }
  }
  std::string list;
  for (size_t i = 0; i < files.size() && i < 5; ++i) list += (i ? ", " : "") + files[i].qualifier;
  if (files.size() > 5) list += ", +" + std::to_string(files.size() - 5) + " more";
  throw Error(ErrorCode::kNotFound,
              "no code file for '" + std::string(name) + "' (" +
                  (files.empty() ? std::string("the archive has no code files")
                                 : "code files: " + list + "; ckpt code --list") +
                  ")",
              src);
}

namespace {
size_t file_index(const TorchScriptModel& m, const TorchScriptCodeFile& f) {
  return static_cast<size_t>(&f - m.files.data());
}

internal::DebugInfo load_debug(const TorchScriptModel& m, size_t k) {
  size_t e = *m.debug_entry[k];
  Bytes b = internal::read_record(*m.zip, e, m.limits.max_metadata_bytes);
  internal::DebugPklOptions o;
  o.source = m.zip->source().name();
  o.record = std::string(m.zip->entries()[e].name);
  o.limits = m.limits;
  return internal::parse_debug_pkl(b.data, o);
}
}  // namespace

const std::string& TorchScriptArchive::code(std::string_view name) const {
  return model_->code_text[file_index(*model_, find_code(name))];
}

TorchScriptDebugFormat TorchScriptArchive::debug_format(std::string_view name) const {
  size_t k = file_index(*model_, find_code(name));
  if (!model_->debug_entry[k]) return TorchScriptDebugFormat::kNone;
  return load_debug(*model_, k).string_table ? TorchScriptDebugFormat::kStringTable
                                             : TorchScriptDebugFormat::kPerRange;
}

std::vector<TorchScriptSourceLine> TorchScriptArchive::source_lines(std::string_view name) const {
  size_t k = file_index(*model_, find_code(name));
  const std::string& text = model_->code_text[k];
  std::optional<internal::DebugInfo> info;
  if (model_->debug_entry[k]) info = load_debug(*model_, k);
  std::vector<TorchScriptSourceLine> out;
  size_t pos = 0;
  uint32_t line = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl;
    TorchScriptSourceLine l;
    l.line = ++line;
    l.text = text.substr(pos, end - pos);
    if (info) {
      // From where the statement's expression starts: the record in effect at the line start
      // often belongs to the statement before, and the one over an assignment's targets to the
      // enclosing block (`y0 = torch.mul(y, 2)` in an if-branch: `y0 = ` is the if's, the call
      // the mul's, which is the range torch's graph gives that node).
      const size_t first = std::min(text.find_first_not_of(' ', pos), end);
      const size_t expr =
          first + expression_start(std::string_view(text).substr(first, end - first));
      if (auto o = internal::debug_origin(*info, static_cast<int64_t>(expr),
                                          static_cast<int64_t>(end))) {
        l.original_file = o->first;
        l.original_line = o->second;
      }
    }
    out.push_back(std::move(l));
    pos = end + 1;
  }
  return out;
}

std::vector<std::string> TorchScriptArchive::extra_files() const {
  std::vector<std::string> out;
  for (auto& [n, i] : model_->extra) out.push_back(n);
  return out;
}

std::string TorchScriptArchive::extra_file(std::string_view name) const {
  for (auto& [n, i] : model_->extra)
    if (n == name)
      return std::string(
          internal::read_record(*model_->zip, i, model_->limits.max_metadata_bytes).str());
  throw Error(ErrorCode::kNotFound, "no extra file '" + std::string(name) + "'",
              checkpoint_.source().name());
}

}  // namespace ckpt
