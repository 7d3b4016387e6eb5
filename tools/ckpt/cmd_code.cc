// ckpt code FILE [QUALNAME] [--ranges] [--list]: the source stored in a TorchScript archive's
// code/ folder (all files, or the one for a qualified name or path), optionally with the original
// file and line of each stored line (from its debug_pkl).

#include <cstdio>

#include "common.h"

namespace ckpt::cli {
namespace {

// Lines [first, last] (1-based) of the top-level class or function `cls` in `text`, or all lines
// (find_code() has checked that the file defines it).
std::pair<uint32_t, uint32_t> class_lines(const std::string& text, const std::string& cls) {
  uint32_t line = 0, first = 0, last = UINT32_MAX;
  size_t pos = 0;
  while (pos < text.size() && !cls.empty()) {
    size_t nl = text.find('\n', pos);
    std::string_view l(text.data() + pos, (nl == std::string::npos ? text.size() : nl) - pos);
    ++line;
    if (first == 0) {
      if (l.rfind("class " + cls + "(", 0) == 0 || l.rfind("class " + cls + ":", 0) == 0 ||
          l.rfind("def " + cls + "(", 0) == 0)
        first = line;
    } else if (!l.empty() && l[0] != ' ') {
      last = line - 1;
      break;
    }
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  if (first == 0) return {1, UINT32_MAX};
  return {first, last};
}

void print_file(const TorchScriptArchive& a, const TorchScriptCodeFile& f, bool ranges, bool header,
                const std::string& cls = {}) {
  if (header) std::printf("# code/%s (%s)\n", f.path.c_str(), f.qualifier.c_str());
  auto [first, last] = class_lines(a.code(f.path), cls);
  if (!ranges && first == 1 && last == UINT32_MAX) {
    const std::string& text = a.code(f.path);
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (!text.empty() && text.back() != '\n') std::printf("\n");
    return;
  }
  auto lines = a.source_lines(f.path);
  std::erase_if(lines, [lo = first, hi = last](const TorchScriptSourceLine& l) {
    return l.line < lo || l.line > hi;  // bindings are not capturable in C++20
  });
  if (!ranges) {
    for (const auto& l : lines) std::printf("%s\n", l.text.c_str());
    return;
  }
  size_t width = 0;
  for (const auto& l : lines) width = std::max(width, l.text.size());
  width = std::min<size_t>(width, 100);
  for (const auto& l : lines) {
    if (l.original_line > 0) {
      std::printf("%5u  %-*s  # %s:%lld\n", l.line, int(width), l.text.c_str(),
                  l.original_file.c_str(), static_cast<long long>(l.original_line));
    } else {
      std::printf("%5u  %s\n", l.line, l.text.c_str());
    }
  }
}

struct CodeOptions {
  std::string file, name;
  bool ranges = false, list = false;
  Common common;
};

void run_code(const CodeOptions& o) {
  TorchScriptArchive a = TorchScriptArchive::from(open_checkpoint(o.file, o.common));
  if (o.list) {
    for (const auto& f : a.code_files()) {
      const char* dbg = "none";
      switch (a.debug_format(f.path)) {
        case TorchScriptDebugFormat::kStringTable:
          dbg = "string-table";
          break;
        case TorchScriptDebugFormat::kPerRange:
          dbg = "per-range";
          break;
        default:
          break;
      }
      std::printf("code/%s  %s  %llu bytes%s  debug: %s\n", f.path.c_str(), f.qualifier.c_str(),
                  static_cast<unsigned long long>(f.size), f.deflated ? " (deflated)" : "", dbg);
    }
    return;
  }
  if (!o.name.empty()) {
    const TorchScriptCodeFile& f = a.find_code(o.name);
    // A class name ("__torch__.MyModule"): only that class's block of its file.
    std::string cls;
    if (o.name.size() > f.qualifier.size() + 1 && o.name.rfind(f.qualifier + ".", 0) == 0 &&
        o.name.find('/') == std::string::npos)
      cls = o.name.substr(f.qualifier.size() + 1);
    if (cls.find('.') != std::string::npos) cls.clear();
    print_file(a, f, o.ranges, false, cls);
    return;
  }
  for (const auto& f : a.code_files()) print_file(a, f, o.ranges, true);
}

}  // namespace

void add_code(CLI::App& app) {
  auto o = std::make_shared<CodeOptions>();
  auto* cmd = app.add_subcommand(
      "code", "TorchScript: print the stored source (all files, or one by qualified name or path)");
  cmd->add_option("FILE", o->file, "TorchScript archive (torch.jit.save)")->required();
  cmd->add_option("QUALNAME", o->name,
                  "qualified name (__torch__.MyModule) or path under code/ (__torch__/x.py)");
  cmd->add_flag("--ranges", o->ranges,
                "show the original file and line of each stored line (from debug_pkl)");
  cmd->add_flag("--list", o->list, "list the code files: path, qualifier, bytes, debug format");
  add_common(*cmd, o->common);
  cmd->callback([o] { run_code(*o); });
}

}  // namespace ckpt::cli
