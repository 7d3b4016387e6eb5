// TorchScript archives: module-path naming, constants, code, debug_pkl (both layouts), rewrite,
// and one test per validation rule, on archives built with ZipWriter. Interop with real torch
// (torch.jit.save / torch.jit.load) is in tests/interop/test_torchscript.py.

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "ckpt/ckpt.h"
#include "formats/torch/debug_pkl.h"
#include "pickle/pickler.h"
#include "test_util.h"
#include "zip/zip_reader.h"
#include "zip/zip_writer.h"
#include "zip_test_util.h"

namespace ckpt {
namespace {

using internal::ZipWriter;
using test::as_span;
using test::TempDir;

// A storage placeholder that the pickler hook turns into torch's persistent id.
ValuePtr pid(const std::string& key, int64_t numel) {
  return Value::object("test", "pid", {Value::string(key)}, nullptr, numel);
}

ValuePtr int_tuple(std::vector<int64_t> v) {
  std::vector<ValuePtr> items;
  for (auto x : v) items.push_back(Value::integer(x));
  return Value::tuple(std::move(items));
}

// _rebuild_tensor_v2 of a contiguous float tensor over storage `key`.
ValuePtr tensor(const std::string& key, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return Value::object("torch._utils", "_rebuild_tensor_v2",
                       {pid(key, n), Value::integer(0), int_tuple(shape), int_tuple(strides),
                        Value::boolean(true), Value::ordered_dict()});
}

std::string pkl(const ValuePtr& root) {
  internal::PicklerHooks h;
  h.persistent_id = [](const Value& v) -> ValuePtr {
    if (v.kind() != Value::Kind::kObject || v.module() != "test") return nullptr;
    return Value::tuple({Value::string("storage"), Value::global("torch", "FloatStorage"),
                         Value::string(v.items()[0]->str()), Value::string("cpu"),
                         Value::integer(v.as_int())});
  };
  std::string out;
  internal::pickle(root, out, h);
  return out;
}

ValuePtr module(const std::string& qual, const std::string& cls,
                std::vector<std::pair<std::string, ValuePtr>> attrs) {
  auto d = Value::dict();
  d->set("training", Value::boolean(true));
  for (auto& [k, v] : attrs) d->set(k, v);
  return Value::object(qual, cls, {}, d);
}

std::string floats(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

const char* kTopCode =
    "class M(Module):\n"
    "  __parameters__ = []\n"
    "  __buffers__ = [\"running\", ]\n"
    "  running : Tensor\n"
    "  training : bool\n"
    "  lin : __torch__.torch.nn.modules.linear.Linear\n"
    "  def forward(self: __torch__.M,\n"
    "    x: Tensor) -> Tensor:\n"
    "    lin = self.lin\n"
    "    return torch.add((lin).forward(x, ), CONSTANTS.c0)\n";
const char* kLinearCode =
    "class Linear(Module):\n"
    "  __parameters__ = [\"weight\", \"bias\", ]\n"
    "  __buffers__ = []\n"
    "  weight : Tensor\n"
    "  bias : Tensor\n"
    "  training : bool\n"
    "  def forward(self: __torch__.torch.nn.modules.linear.Linear,\n"
    "    input: Tensor) -> Tensor:\n"
    "    return torch.linear(input, self.weight, self.bias)\n";

// Debug info for kTopCode: line 10 ("    return torch.add(...)") came from model.py line 21.
internal::DebugInfo top_debug() {
  internal::DebugInfo d;
  internal::DebugSource null;
  null.null = true;
  internal::DebugSource s;
  s.text = "    def forward(self, x):\n        return self.lin(x) + self.c\n";
  s.filename = "model.py";
  s.starting_line = 20;
  d.sources = {null, s};
  std::string code = kTopCode;
  int64_t ret = static_cast<int64_t>(code.find("torch.add"));
  d.records = {{0, 0, 0, 0, 0}, {ret, 1, 34, 48, 3}, {ret + 9, 0, 0, 0, 0}};
  return d;
}

// The per-range (old) layout of the same info, pickled as Python would.
std::string per_range_pkl(const internal::DebugInfo& d) {
  std::vector<ValuePtr> recs;
  for (auto& r : d.records) {
    const auto& s = d.sources[r.source];
    auto src = Value::tuple({Value::string(s.text),
                             s.filename ? Value::string(*s.filename) : Value::none(),
                             Value::integer(s.starting_line)});
    recs.push_back(
        Value::tuple({Value::integer(r.byte_offset),
                      Value::tuple({src, Value::integer(r.start), Value::integer(r.end)}),
                      Value::integer(r.tag.value_or(-1))}));
  }
  std::string out;
  internal::pickle(Value::tuple(std::move(recs)), out);
  return out;
}

struct Parts {
  bool constants_pkl = true, data_pkl = true, old_debug = false;
  std::string debug;  // replaces the top debug_pkl when set
  ValuePtr root;      // replaces the module tree when set
  std::function<void(ZipWriter&)> extra;
};

std::vector<std::byte> build(const Parts& p = {}) {
  return test::build_zip([&](ZipWriter& w) {
    w.add("extra/meta.json", std::string_view("{\"a\": 1}"));
    w.add("data/0", floats({1, 2, 3, 4, 5, 6}));
    w.add("data/1", floats({7, 8}));
    w.add("data/2", floats({9, 10}));
    ValuePtr root = p.root;
    if (!root) {
      auto lin = module("__torch__.torch.nn.modules.linear", "Linear",
                        {{"weight", tensor("0", {2, 3})}, {"bias", tensor("1", {2})}});
      root = module("__torch__", "M", {{"running", tensor("2", {2})}, {"lin", lin}});
    }
    if (p.data_pkl) w.add("data.pkl", pkl(root));
    w.add_deflated("code/__torch__.py", as_span(kTopCode));
    std::string dbg = !p.debug.empty() ? p.debug
                      : p.old_debug    ? per_range_pkl(top_debug())
                                       : internal::write_debug_pkl_table(top_debug());
    w.add_deflated("code/__torch__.py.debug_pkl", as_span(dbg));
    w.add_deflated("code/__torch__/torch/nn/modules/linear.py", as_span(kLinearCode));
    if (p.extra) p.extra(w);
    w.add("constants/0", floats({0.5f}));
    if (p.constants_pkl) w.add("constants.pkl", pkl(Value::tuple({tensor("0", {})})));
    w.add("version", std::string_view("3\n"));
  });
}

TorchScriptArchive open_bytes(std::vector<std::byte> b, OpenOptions o = {}) {
  return TorchScriptArchive::from(Checkpoint::open(memory_source(std::move(b), "ts.pt"), o));
}

ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no ckpt::Error thrown";
  return ErrorCode::kIo;
}

TEST(TorchScript, NamesByModulePathWithTypesAndConstants) {
  auto a = open_bytes(build());
  const Checkpoint& c = a.checkpoint();
  EXPECT_EQ(c.format(), Format::kTorchScript);
  std::vector<std::string> names;
  for (auto& t : c.tensors()) names.push_back(t.name + ":" + t.type);
  EXPECT_EQ(names, (std::vector<std::string>{"running:buffer", "lin.weight:param", "lin.bias:param",
                                             "constants.0:constant"}));
  Tensor w = c.tensor("lin.weight");
  float v[6];
  std::memcpy(v, w.data(), sizeof v);
  EXPECT_EQ(v[5], 6.f);
  Tensor k = c.tensor("constants.0");
  float kv;
  std::memcpy(&kv, k.data(), 4);
  EXPECT_EQ(kv, 0.5f);
  ASSERT_EQ(a.state_dict().size(), 3u);
  EXPECT_EQ(a.state_dict()[1].first, "lin.weight");
  EXPECT_EQ(c.properties().at("code_files"), "2");
  EXPECT_EQ(c.properties().at("constants"), "1");
  EXPECT_EQ(a.extra_files(), std::vector<std::string>{"meta.json"});
  EXPECT_EQ(a.extra_file("meta.json"), "{\"a\": 1}");
  EXPECT_FALSE(a.has_bytecode());
  ASSERT_TRUE(a.constants() && a.constants()->kind() == Value::Kind::kTuple);
}

TEST(TorchScript, FindsCodeByQualifiedNameAndPath) {
  auto a = open_bytes(build());
  ASSERT_EQ(a.code_files().size(), 2u);
  EXPECT_EQ(a.code_files()[1].qualifier, "__torch__.torch.nn.modules.linear");
  EXPECT_EQ(a.code("__torch__.M"), kTopCode);
  EXPECT_EQ(a.code("__torch__.torch.nn.modules.linear.Linear"), kLinearCode);
  EXPECT_EQ(a.code("code/__torch__/torch/nn/modules/linear.py"), kLinearCode);
  EXPECT_EQ(a.code("archive/code/__torch__.py"), kTopCode);
  EXPECT_EQ(code_of([&] { a.code("__nothing__.X"); }), ErrorCode::kNotFound);
  // A qualifier's file does not stand in for a class it does not define.
  for (const char* missing : {"__torch__.Nope", "__torch__.M.forward", "__torch__.torch.nn.X",
                              "__torch__.torch.nn.modules.linear.Nope"}) {
    Error e = test::capture_error([&] { a.find_code(missing); });
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << missing;
    EXPECT_NE(e.message().find(" defines "), std::string::npos) << e.message();
  }
}

TEST(TorchScript, SetstateTupleNamesAttributes) {
  const char* code =
      "class G(Module):\n"
      "  __parameters__ = [\"w\", ]\n"
      "  __buffers__ = []\n"
      "  def __setstate__(s: __torch__.G,\n"
      "    st: Tuple[Tensor, int, bool]) -> NoneType:\n"
      "    s.w = (st)[0]\n"
      "    s.k = (st)[1]\n"
      "    return None\n";
  auto b = test::build_zip([&](ZipWriter& w) {
    w.add("data/0", floats({1, 2}));
    w.add("data.pkl", pkl(Value::object("__torch__", "G", {},
                                        Value::tuple({tensor("0", {2}), Value::integer(3)}))));
    w.add_deflated("code/__torch__.py", as_span(code));
    w.add("constants.pkl", pkl(Value::tuple()));
    w.add("version", std::string_view("3\n"));
  });
  auto a = open_bytes(b);
  ASSERT_EQ(a.checkpoint().tensors().size(), 1u);
  EXPECT_EQ(a.checkpoint().tensors()[0].name, "w");
  EXPECT_EQ(a.checkpoint().tensors()[0].type, "param");
  ASSERT_EQ(a.state_dict().size(), 1u);
}

TEST(TorchScript, DebugPklBothFormatsGiveOrigins) {
  for (bool old : {false, true}) {
    Parts p;
    p.old_debug = old;
    auto a = open_bytes(build(p));
    EXPECT_EQ(a.debug_format("__torch__.M"),
              old ? TorchScriptDebugFormat::kPerRange : TorchScriptDebugFormat::kStringTable);
    auto lines = a.source_lines("__torch__.M");
    ASSERT_EQ(lines.size(), 10u);
    EXPECT_EQ(lines[9].original_file, "model.py");
    EXPECT_EQ(lines[9].original_line, 21);
    EXPECT_EQ(lines[0].original_line, 0);
    EXPECT_EQ(a.debug_format("__torch__.torch.nn.modules.linear"), TorchScriptDebugFormat::kNone);
  }
}

TEST(TorchScript, StringTableRoundTrip) {
  internal::DebugInfo d = top_debug();
  std::string bytes = internal::write_debug_pkl_table(d);
  internal::DebugInfo back = internal::parse_debug_pkl(as_span(bytes), {});
  EXPECT_TRUE(back.string_table);
  ASSERT_EQ(back.records.size(), d.records.size());
  EXPECT_EQ(back.sources[back.records[1].source].text, d.sources[1].text);
  EXPECT_EQ(back.records[1].tag, 3);
  int64_t ret = static_cast<int64_t>(std::string(kTopCode).find("torch.add"));
  auto o = internal::debug_origin(back, ret - 7, ret + 40);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->first, "model.py");
  EXPECT_EQ(o->second, 21);
  EXPECT_FALSE(internal::debug_origin(back, 0, 10));
}

std::vector<std::pair<std::string, std::string>> records_of(const std::string& path) {
  internal::ZipReader r(open_file_source(path), Limits{});
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < r.entries().size(); ++i)
    out.emplace_back(r.entries()[i].name, std::string(r.read(i).str()));
  return out;
}

TEST(TorchScript, RewriteKeepsContentAndIsStable) {
  TempDir dir;
  test::write_file(dir.file("in.pt"), build());
  auto a = TorchScriptArchive::open(dir.file("in.pt"));
  a.rewrite(dir.file("a.pt"));
  TorchScriptArchive::open(dir.file("a.pt")).rewrite(dir.file("b.pt"));
  EXPECT_EQ(test::read_file(dir.file("a.pt")), test::read_file(dir.file("b.pt")));
  EXPECT_EQ(records_of(dir.file("in.pt")), records_of(dir.file("a.pt")));
}

TEST(TorchScript, RewriteDebugTableAndStrip) {
  TempDir dir;
  Parts p;
  p.old_debug = true;
  test::write_file(dir.file("old.pt"), build(p));
  auto a = TorchScriptArchive::open(dir.file("old.pt"));
  TorchScriptRewriteOptions o;
  o.debug = TorchScriptRewriteOptions::Debug::kTable;
  auto r = a.rewrite(dir.file("table.pt"), o);
  EXPECT_EQ(r.debug_converted, 1u);
  EXPECT_GT(r.debug_bytes_after, 0u);
  EXPECT_GT(r.debug_bytes_before, 0u);
  auto t = TorchScriptArchive::open(dir.file("table.pt"));
  EXPECT_EQ(t.debug_format("__torch__.M"), TorchScriptDebugFormat::kStringTable);
  EXPECT_EQ(t.source_lines("__torch__.M")[9].original_line, 21);

  o.debug = TorchScriptRewriteOptions::Debug::kStrip;
  o.alignment = 4096;
  r = a.rewrite(dir.file("strip.pt"), o);
  EXPECT_EQ(r.debug_stripped, 1u);
  auto s = TorchScriptArchive::open(dir.file("strip.pt"));
  EXPECT_FALSE(s.code_files()[0].has_debug);
  for (auto& st : s.checkpoint().storages()) EXPECT_EQ(st.offset % 4096, 0u) << st.key;
}

// ---- hostile input: one test per rule ----

TEST(TorchScriptHostile, MissingConstantsPkl) {
  Parts p;
  p.constants_pkl = false;
  auto b = build(p);
  EXPECT_EQ(code_of([&] { Checkpoint::open(memory_source(b)); }), ErrorCode::kCorrupt);
}

TEST(TorchScriptHostile, MissingDataPkl) {
  Parts p;
  p.data_pkl = false;
  auto b = build(p);
  EXPECT_EQ(code_of([&] { Checkpoint::open(memory_source(b)); }), ErrorCode::kCorrupt);
}

TEST(TorchScriptHostile, NotTorchScript) {
  auto b = test::build_zip([&](ZipWriter& w) {
    w.add("data.pkl", pkl(Value::dict()));
    w.add("version", std::string_view("3\n"));
  });
  Checkpoint c = Checkpoint::open(memory_source(b));
  EXPECT_EQ(code_of([&] { TorchScriptArchive::from(c); }), ErrorCode::kInvalidArgument);
}

// Index of the entry called `name` and its directory/local layout.
size_t entry_index(const std::vector<std::byte>& b, const std::string& name) {
  internal::ZipReader r(memory_source(b), Limits{});
  return *r.find(name);
}

TEST(TorchScriptHostile, CorruptDeflateStream) {
  auto b = build();
  internal::ZipReader r(memory_source(b), Limits{});
  size_t i = *r.find("archive/code/__torch__/torch/nn/modules/linear.py");
  uint64_t off = r.data_offset(i);
  for (uint64_t k = 2; k < r.entries()[i].compressed_size; ++k) b[off + k] = std::byte{0xff};
  EXPECT_EQ(code_of([&] { Checkpoint::open(memory_source(b)); }), ErrorCode::kCorrupt);
}

TEST(TorchScriptHostile, TruncatedDeflateStream) {
  auto b = build();
  size_t i = entry_index(b, "archive/code/__torch__/torch/nn/modules/linear.py");
  auto l = test::zip_layout(b);
  uint32_t csize = test::get_at<uint32_t>(b, l.central[i] + 20);
  test::put_at<uint32_t>(b, l.central[i] + 20, csize / 2);  // the stream stops half way
  ErrorCode c = code_of([&] { Checkpoint::open(memory_source(b)); });
  EXPECT_TRUE(c == ErrorCode::kCorrupt || c == ErrorCode::kTruncated) << error_code_name(c);
}

TEST(TorchScriptHostile, DeflateBomb) {
  Parts p;
  std::string big(8 << 20, ' ');
  p.extra = [&](ZipWriter& w) { w.add_deflated("code/__torch__/big.py", as_span(big)); };
  auto b = build(p);
  OpenOptions o;
  o.limits.max_inflated_bytes = 1 << 20;
  EXPECT_EQ(code_of([&] { Checkpoint::open(memory_source(b), o); }), ErrorCode::kLimitExceeded);
}

TEST(TorchScriptHostile, CodeNameEscapesFolder) {
  Parts p;
  // ZipWriter refuses such names: write a placeholder of the same length, then patch it in.
  p.extra = [&](ZipWriter& w) { w.add_deflated("code/QQ/QQ/evil.py", as_span(kLinearCode)); };
  auto b = build(p);
  std::string_view from = "code/QQ/QQ/evil.py", to = "code/../../evil.py";
  for (size_t i = 0; i + from.size() <= b.size(); ++i)
    if (std::memcmp(b.data() + i, from.data(), from.size()) == 0)
      std::memcpy(b.data() + i, to.data(), to.size());
  EXPECT_EQ(code_of([&] { Checkpoint::open(memory_source(b)); }), ErrorCode::kCorrupt);
}

TEST(TorchScriptHostile, CodeNameWithEmptyComponent) {
  Parts p;
  p.extra = [&](ZipWriter& w) { w.add_deflated("code/a//b.py", as_span(kLinearCode)); };
  auto b = build(p);
  EXPECT_EQ(code_of([&] { Checkpoint::open(memory_source(b)); }), ErrorCode::kCorrupt);
}

TEST(TorchScriptHostile, AskedPathEscapesFolder) {
  auto a = open_bytes(build());
  EXPECT_EQ(code_of([&] { a.code("code/../../etc/passwd.py"); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { a.code("/etc/x.py"); }), ErrorCode::kInvalidArgument);
}

TEST(TorchScriptHostile, DebugStringIndexOutOfRange) {
  // A string-table record whose source names line 99 of a 2-entry table.
  auto list =
      Value::object("torch.jit._pickle", "build_intlist", {Value::list({Value::integer(99)})});
  auto src = Value::tuple({list, Value::integer(1), Value::integer(1)});
  auto rec =
      Value::tuple({Value::integer(0), Value::tuple({src, Value::integer(0), Value::integer(0)}),
                    Value::integer(0)});
  auto top =
      Value::tuple({Value::string("FORMAT_WITH_STRING_TABLE"),
                    Value::tuple({Value::string(""), Value::string("f.py")}), Value::tuple({rec})});
  std::string d;
  internal::pickle(top, d);
  Parts p;
  p.debug = d;
  auto a = open_bytes(build(p));
  EXPECT_EQ(code_of([&] { a.source_lines("__torch__.M"); }), ErrorCode::kCorrupt);
}

TEST(TorchScriptHostile, DebugFileIndexOutOfRange) {
  auto list =
      Value::object("torch.jit._pickle", "build_intlist", {Value::list({Value::integer(1)})});
  auto src = Value::tuple({list, Value::integer(7), Value::integer(1)});
  auto rec =
      Value::tuple({Value::integer(0), Value::tuple({src, Value::integer(0), Value::integer(0)}),
                    Value::integer(0)});
  auto top =
      Value::tuple({Value::string("FORMAT_WITH_STRING_TABLE"),
                    Value::tuple({Value::string(""), Value::string("x\n")}), Value::tuple({rec})});
  std::string d;
  internal::pickle(top, d);
  EXPECT_EQ(code_of([&] { internal::parse_debug_pkl(as_span(d), {}); }), ErrorCode::kCorrupt);
}

TEST(TorchScriptHostile, DebugRangeOutsideSourceText) {
  internal::DebugInfo d = top_debug();
  d.records[1].end = 10000;
  std::string bytes = per_range_pkl(d);
  EXPECT_EQ(code_of([&] { internal::parse_debug_pkl(as_span(bytes), {}); }), ErrorCode::kCorrupt);
}

TEST(TorchScriptHostile, DebugRecordsNotSorted) {
  internal::DebugInfo d = top_debug();
  std::swap(d.records[0], d.records[2]);
  std::string bytes = per_range_pkl(d);
  EXPECT_EQ(code_of([&] { internal::parse_debug_pkl(as_span(bytes), {}); }), ErrorCode::kCorrupt);
}

TEST(TorchScriptHostile, DebugDisallowedGlobal) {
  std::string bytes;
  internal::pickle(Value::tuple({Value::object("os", "system", {Value::string("true")})}), bytes);
  EXPECT_EQ(code_of([&] { internal::parse_debug_pkl(as_span(bytes), {}); }),
            ErrorCode::kUnsupported);
}

TEST(TorchScriptHostile, ConstantsNameMissingRecord) {
  auto b = test::build_zip([&](ZipWriter& w) {
    w.add("data.pkl", pkl(module("__torch__", "M", {})));
    w.add("constants.pkl", pkl(Value::tuple({tensor("5", {})})));
    w.add("version", std::string_view("3\n"));
  });
  EXPECT_EQ(code_of([&] { Checkpoint::open(memory_source(b)); }), ErrorCode::kCorrupt);
}

}  // namespace
}  // namespace ckpt
