// TorchScript debug_pkl records: parse both layouts, write the string-table one.
//
// Byte layout: a protocol-2 pickle of nested tuples, see debug_pkl.h for the shapes; the only
// globals are torch.jit._pickle's typed-list helpers (build_intlist for line_indices), which are
// identity calls here.

#include "formats/torch/debug_pkl.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>

#include "ckpt/error.h"
#include "pickle/unpickler.h"

namespace ckpt::internal {
namespace {

constexpr std::string_view kTableMarker = "FORMAT_WITH_STRING_TABLE";

class Parser {
 public:
  explicit Parser(const DebugPklOptions& o) : opt_(o) {}

  DebugInfo run(std::span<const std::byte> data) {
    UnpicklerHooks hooks;
    hooks.allow_global = [](const std::string& m, const std::string&) {
      return m == "torch.jit._pickle";
    };
    hooks.call = [](PickleHeap& h, Ref fn, std::span<const Ref> args) -> Ref {
      if (h.module(fn) == "torch.jit._pickle" && !args.empty()) return args[0];
      return kNoRef;
    };
    UnpickleOptions uo;
    uo.source = opt_.source;
    uo.record = opt_.record;
    uo.limits = opt_.limits;
    ValuePtr top = unpickle(data, hooks, uo);

    DebugInfo out;
    const Value* records = top.get();
    if (top && top->kind() == Value::Kind::kTuple && top->items().size() == 3 &&
        top->items()[0]->kind() == Value::Kind::kString && top->items()[0]->str() == kTableMarker) {
      out.string_table = true;
      const Value& table = *top->items()[1];
      if (!table.is_sequence()) fail("string table is not a tuple");
      table_.reserve(table.items().size());
      for (const ValuePtr& s : table.items()) {
        if (!s || s->kind() != Value::Kind::kString) fail("string table holds a non-string");
        table_.push_back(&s->str());
      }
      records = top->items()[2].get();
    }
    if (!records || !records->is_sequence()) fail("debug records are not a tuple");
    if (records->items().size() > opt_.limits.max_tensors * 16)
      throw Error(ErrorCode::kLimitExceeded, "too many debug records", opt_.source, opt_.record);
    int64_t last = -1;
    for (const ValuePtr& r : records->items()) {
      if (!r || r->kind() != Value::Kind::kTuple || r->items().size() < 2 || r->items().size() > 3)
        fail("debug record is not a (byte_offset, source_range[, tag]) tuple");
      DebugRecord rec;
      rec.byte_offset = integer(r->items()[0], "byte offset");
      if (rec.byte_offset < last) fail("debug records are not sorted by byte offset");
      last = rec.byte_offset;
      const ValuePtr& range = r->items()[1];
      if (!range || range->kind() != Value::Kind::kTuple || range->items().size() != 3)
        fail("source range is not a (source, start, end) tuple");
      rec.source = source(range->items()[0], out);
      rec.start = integer(range->items()[1], "range start");
      rec.end = integer(range->items()[2], "range end");
      const DebugSource& src = out.sources[rec.source];
      // torch writes ranges over an empty text (a source it did not keep, e.g. a builtin
      // module's such as nn.MultiheadAttention): accepted, as torch.jit.load does; they name a
      // file and a line, never text.
      if (rec.start > rec.end ||
          (!src.null && !src.text.empty() && static_cast<uint64_t>(rec.end) > src.text.size()))
        fail("source range [" + std::to_string(rec.start) + ", " + std::to_string(rec.end) +
             ") is outside its source text of " + std::to_string(src.text.size()) + " bytes");
      if (r->items().size() == 3) rec.tag = integer(r->items()[2], "tag");
      out.records.push_back(rec);
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    throw Error(ErrorCode::kCorrupt, msg, opt_.source, opt_.record);
  }

  int64_t integer(const ValuePtr& v, const char* what) const {
    if (!v || v->kind() != Value::Kind::kInt || !v->str().empty())
      fail(std::string("expected an integer for ") + what);
    if (v->as_int() < 0) fail(std::string("negative ") + what);
    return v->as_int();
  }

  const std::string& text_at(const ValuePtr& v, const char* what) const {
    int64_t i = integer(v, what);
    if (static_cast<uint64_t>(i) >= table_.size())
      fail(std::string(what) + " " + std::to_string(i) + " is outside the string table (" +
           std::to_string(table_.size()) + " entries)");
    return *table_[static_cast<size_t>(i)];
  }

  // Index of the source `v` in out.sources (each distinct source once).
  size_t source(const ValuePtr& v, DebugInfo& out) {
    auto seen = by_ptr_.find(v.get());
    if (seen != by_ptr_.end()) return seen->second;
    if (!v || v->kind() != Value::Kind::kTuple || v->items().size() != 3)
      fail("source is not a 3-tuple");
    DebugSource s;
    if (!out.string_table) {
      if (v->items()[0]->kind() != Value::Kind::kString) fail("source text is not a string");
      s.text = v->items()[0]->str();
      if (v->items()[1]->kind() == Value::Kind::kString) {
        s.filename = v->items()[1]->str();
      } else if (!v->items()[1]->is_none()) {
        fail("source file name is neither a string nor None");
      }
      // No text and no file: what the per-range layout can say for "no source".
      s.null = s.text.empty() && !s.filename;
    } else {
      const Value& lines = *v->items()[0];
      if (!lines.is_sequence()) fail("source line indices are not a list");
      if (lines.items().empty()) {
        s.null = true;
      } else {
        for (const ValuePtr& li : lines.items()) s.text += text_at(li, "line index");
        s.filename = text_at(v->items()[1], "file name index");
      }
    }
    s.starting_line = integer(v->items()[2], "starting line");
    auto key = std::make_tuple(s.null, s.text, s.filename, s.starting_line);
    auto [it, inserted] = by_content_.emplace(key, out.sources.size());
    if (inserted) out.sources.push_back(std::move(s));
    by_ptr_.emplace(v.get(), it->second);
    return it->second;
  }

  const DebugPklOptions& opt_;
  std::vector<const std::string*> table_;
  std::unordered_map<const Value*, size_t> by_ptr_;
  std::map<std::tuple<bool, std::string, std::optional<std::string>, int64_t>, size_t> by_content_;
};

}  // namespace

DebugInfo parse_debug_pkl(std::span<const std::byte> data, const DebugPklOptions& options) {
  return Parser(options).run(data);
}

namespace {

// A protocol-2 emitter restricted to the opcodes torch's C++ unpickler reads: lists are always
// MARK ... APPENDS (it has no APPEND opcode), tuples TUPLE1-3 or MARK ... TUPLE.
class Emitter {
 public:
  std::string out = std::string("\x80\x02", 2);

  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      out += 'K';
      out += static_cast<char>(v);
    } else if (v >= 0 && v < 65536) {
      out += 'M';
      raw(static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out += 'J';
      raw(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {
      out += "\x8a\x08";
      raw(static_cast<uint64_t>(v), 8);
    }
  }
  void string(const std::string& s) {
    out += 'X';
    raw(s.size(), 4);
    out += s;
  }
  void mark() { out += '('; }
  // Closes a tuple of n items pushed since the matching mark() (mark() only when n > 3).
  void tuple(size_t n) {
    static const char kOps[] = {')', '\x85', '\x86', '\x87'};
    out += n <= 3 ? kOps[n] : 't';
  }
  uint32_t put() {
    uint32_t id = memo_++;
    if (id < 256) {
      out += 'q';
      out += static_cast<char>(id);
    } else {
      out += 'r';
      raw(id, 4);
    }
    return id;
  }
  void get(uint32_t id) {
    if (id < 256) {
      out += 'h';
      out += static_cast<char>(id);
    } else {
      out += 'j';
      raw(id, 4);
    }
  }

 private:
  void raw(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  uint32_t memo_ = 0;
};

}  // namespace

std::string write_debug_pkl_table(const DebugInfo& info) {
  std::unordered_map<std::string, int64_t> index = {{"", 0}};
  // Interned line indices, file index, per source. Lines keep their '\n'; the rest after the
  // last one (often "") is a line too, so that the concatenation is the text.
  std::vector<std::pair<std::vector<int64_t>, int64_t>> src_idx;
  std::vector<std::string> strings = {""};
  auto intern = [&](std::string s) {
    auto [it, inserted] = index.emplace(s, static_cast<int64_t>(strings.size()));
    if (inserted) strings.push_back(std::move(s));
    return it->second;
  };
  for (const DebugSource& s : info.sources) {
    std::vector<int64_t> lines;
    int64_t fname = 0;
    if (!s.null) {
      size_t pos = 0;
      while (true) {
        size_t nl = s.text.find('\n', pos);
        if (nl == std::string::npos) {
          lines.push_back(intern(s.text.substr(pos)));
          break;
        }
        lines.push_back(intern(s.text.substr(pos, nl + 1 - pos)));
        pos = nl + 1;
      }
      fname = intern(s.filename.value_or(""));
    }
    src_idx.emplace_back(std::move(lines), fname);
  }

  Emitter e;
  e.string(std::string(kTableMarker));
  e.put();
  e.mark();
  for (const std::string& s : strings) {
    e.string(s);
    e.put();
  }
  e.out += 't';
  e.put();
  e.mark();  // records
  std::optional<uint32_t> intlist;
  std::vector<std::optional<uint32_t>> src_memo(info.sources.size());
  for (const DebugRecord& r : info.records) {
    e.integer(r.byte_offset);
    // source_range = (source, start, end); each source pickled once, then memo references.
    if (auto m = src_memo.at(r.source)) {
      e.get(*m);
    } else {
      const auto& [lines, fname] = src_idx[r.source];
      if (intlist) {
        e.get(*intlist);
      } else {
        e.out += "ctorch.jit._pickle\nbuild_intlist\n";
        intlist = e.put();
      }
      e.out += "(]";  // MARK EMPTY_LIST: args tuple of one list
      e.mark();
      for (int64_t li : lines) e.integer(li);
      e.out += "et";  // APPENDS, TUPLE
      e.out += 'R';
      e.integer(fname);
      e.integer(info.sources[r.source].null ? 0 : info.sources[r.source].starting_line);
      e.tuple(3);
      src_memo[r.source] = e.put();
    }
    e.integer(r.start);
    e.integer(r.end);
    e.tuple(3);
    if (r.tag) {
      e.integer(*r.tag);
      e.tuple(3);
    } else {
      e.tuple(2);
    }
  }
  e.out += 't';
  e.tuple(3);
  e.out += '.';
  return std::move(e.out);
}

std::optional<std::pair<std::string, int64_t>> debug_origin(const DebugInfo& info, int64_t begin,
                                                            int64_t end) {
  const auto& rs = info.records;
  auto it = std::upper_bound(rs.begin(), rs.end(), begin,
                             [](int64_t b, const DebugRecord& r) { return b < r.byte_offset; });
  // The record in effect at `begin` (if any), then those that start inside [begin, end).
  size_t j = static_cast<size_t>(it - rs.begin());
  if (j > 0) --j;
  for (; j < rs.size(); ++j) {
    const DebugRecord& r = rs[j];
    if (r.byte_offset > begin && r.byte_offset >= end) break;
    const DebugSource& s = info.sources[r.source];
    if (s.null) continue;
    int64_t line = s.starting_line +
                   std::count(s.text.begin(),
                              s.text.begin() + static_cast<ptrdiff_t>(std::min<uint64_t>(
                                                   static_cast<uint64_t>(r.start), s.text.size())),
                              '\n');
    return std::make_pair(s.filename.value_or(""), line);
  }
  return std::nullopt;
}

}  // namespace ckpt::internal
