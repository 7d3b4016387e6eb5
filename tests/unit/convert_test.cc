// ckpt::convert and ckpt::flatten_state_dict (include/ckpt/convert.h): every pair of formats,
// tied names, shared storages, deep trees, progress, atomic failure, encryption. The same
// conversions against real torch/safetensors are in tests/interop (`ckpt convert`).

#include "ckpt/convert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "ckpt/ckpt.h"
#include "ckpt/safetensors.h"
#include "ckpt/tensorizer.h"
#include "test_util.h"

namespace ckpt {
namespace {

using test::TempDir;

using test::make_tensor;

// Tensors every format holds: several dtypes, a 0-d and an empty tensor, one over 1 MiB (the
// sliced write path) and one over 8 MiB (progress pieces).
std::vector<Tensor> sample_tensors() {
  return {make_tensor("model.embed.weight", DType::kFloat32, {64, 48}, 1),
          make_tensor("model.layers.0.bias", DType::kBFloat16, {48}, 2),
          make_tensor("model.layers.0.steps", DType::kInt64, {}, 3),
          make_tensor("model.layers.0.mask", DType::kBool, {7}, 4),
          make_tensor("model.empty", DType::kFloat16, {0, 3}, 5),
          make_tensor("model.big", DType::kFloat32, {3, 1 << 20}, 6),
          make_tensor("model.mid", DType::kUInt8, {(1 << 20) + 77}, 7)};
}

void write_source(ConvertFormat f, const std::string& path, const std::vector<Tensor>& ts) {
  switch (f) {
    case ConvertFormat::kTorch: {
      SaveOptions o;
      o.fsync = false;
      save_torch(path, state_dict_value(ts), ts, o);
      return;
    }
    case ConvertFormat::kSafetensors: {
      SafetensorsSaveOptions o;
      o.fsync = false;
      save_safetensors(path, ts, {{"format", "pt"}}, o);
      return;
    }
    case ConvertFormat::kTensorizer: {
      TensorizerSaveOptions o;
      o.fsync = false;
      save_tensorizer(path, ts, o);
      return;
    }
    case ConvertFormat::kAuto:
      break;
  }
  FAIL();
}

// sample_tensors() saved as a torch zip in `dir`, opened.
Checkpoint torch_source(TempDir& dir) {
  const std::string src = dir.file("src.pt");
  write_source(ConvertFormat::kTorch, src, sample_tensors());
  return Checkpoint::open(src);
}

const char* ext_of(ConvertFormat f) {
  switch (f) {
    case ConvertFormat::kTorch:
      return ".pt";
    case ConvertFormat::kSafetensors:
      return ".safetensors";
    default:
      return ".tensors";
  }
}

// name -> (dtype, shape, contiguous bytes)
struct Seen {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
  bool operator==(const Seen&) const = default;
};
std::map<std::string, Seen> contents(const Checkpoint& c) {
  std::map<std::string, Seen> m;
  for (size_t i = 0; i < c.tensors().size(); ++i) {
    Tensor t = c.tensor(i);
    m[t.name()] = Seen{t.dtype(), t.shape(), t.contiguous_bytes()};
  }
  return m;
}
std::map<std::string, Seen> contents(const std::vector<Tensor>& ts) {
  std::map<std::string, Seen> m;
  for (const auto& t : ts) m[t.name()] = Seen{t.dtype(), t.shape(), t.contiguous_bytes()};
  return m;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> v;
  for (auto& e : std::filesystem::directory_iterator(dir)) v.push_back(e.path().filename());
  std::sort(v.begin(), v.end());
  return v;
}

ConvertOptions quick() {
  ConvertOptions o;
  o.fsync = false;
  return o;
}

constexpr ConvertFormat kFormats[] = {ConvertFormat::kTorch, ConvertFormat::kSafetensors,
                                      ConvertFormat::kTensorizer};

TEST(Convert, EveryPairOfFormatsKeepsNamesDtypesShapesAndBytes) {
  TempDir dir;
  const auto ts = sample_tensors();
  const auto want = contents(ts);
  for (ConvertFormat from : kFormats) {
    const std::string src = dir.file(std::string("src") + ext_of(from));
    write_source(from, src, ts);
    for (bool mmap : {true, false}) {
      OpenOptions oo;
      oo.mmap = mmap;
      Checkpoint c = Checkpoint::open(src, oo);
      for (ConvertFormat to : kFormats) {
        SCOPED_TRACE(std::string(convert_format_name(from)) + " -> " + convert_format_name(to) +
                     (mmap ? " (mmap)" : " (pread)"));
        const std::string out = dir.file(std::string("out") + ext_of(to));
        ConvertReport r = convert(c, out, quick());  // format from the extension
        EXPECT_EQ(r.format, to);
        EXPECT_EQ(r.tensors, ts.size());
        EXPECT_EQ(r.bytes_written, std::filesystem::file_size(out));
        EXPECT_TRUE(r.not_written.empty());
        EXPECT_TRUE(r.copied_shared.empty());
        Checkpoint back = Checkpoint::open(out);
        EXPECT_EQ(contents(back), want);
        if (to == ConvertFormat::kTorch) EXPECT_EQ(back.verify(), back.records().size());
        if (to == ConvertFormat::kTensorizer) EXPECT_GT(back.verify(), 0u);
      }
    }
  }
  EXPECT_EQ(files_in(dir.path()).size(), 6u);  // three sources, three outputs, no temporaries
}

TEST(Convert, SinkOverloadWritesWhatThePathOverloadWrites) {
  TempDir dir;
  Checkpoint c = torch_source(dir);
  for (ConvertFormat to : kFormats) {
    const std::string out = dir.file(std::string("o") + ext_of(to));
    ConvertOptions o = quick();
    if (to == ConvertFormat::kTorch)
      o.target = PtTarget{.archive_name = "o"};  // what the path overload derives from "o.pt"
    convert(c, out, o);
    MemorySink mem(std::string("x") + ext_of(to));  // the format from the sink's name
    ConvertReport r = convert(c, mem, o);
    EXPECT_EQ(r.format, to);
    EXPECT_EQ(mem.bytes(), test::read_file(out)) << convert_format_name(to);
  }
  MemorySink unnamed;
  EXPECT_CKPT_ERROR(convert(c, unnamed), ErrorCode::kInvalidArgument);
}

TEST(Convert, FormatNames) {
  EXPECT_EQ(convert_format_for_path("a/b.pt"), ConvertFormat::kTorch);
  EXPECT_EQ(convert_format_for_path("b.pth"), ConvertFormat::kTorch);
  EXPECT_EQ(convert_format_for_path("pytorch_model.bin"), ConvertFormat::kTorch);
  EXPECT_EQ(convert_format_for_path("x.ckpt"), ConvertFormat::kTorch);
  EXPECT_EQ(convert_format_for_path("m.safetensors"), ConvertFormat::kSafetensors);
  EXPECT_EQ(convert_format_for_path("m.tensors"), ConvertFormat::kTensorizer);
  EXPECT_CKPT_ERROR(convert_format_for_path("m.npz"), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(convert_format_for_path("model"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(parse_convert_format("torch"), ConvertFormat::kTorch);
  EXPECT_EQ(parse_convert_format("pt"), ConvertFormat::kTorch);
  EXPECT_EQ(parse_convert_format("tensorizer"), ConvertFormat::kTensorizer);
  EXPECT_CKPT_ERROR(parse_convert_format("onnx"), ErrorCode::kInvalidArgument);
  for (ConvertFormat f : kFormats) EXPECT_EQ(parse_convert_format(convert_format_name(f)), f);
}

TEST(Convert, ParseTargetTakesEachSettingForTheFormatsThatOwnItOnly) {
  // Every format is one row of the table: its names and extensions lead back to it.
  for (const TargetFormatInfo& f : target_formats()) {
    EXPECT_EQ(target_format(default_target(f.format)), f.format);
    EXPECT_EQ(target_format(parse_target(f.name)), f.format);
    for (std::string_view e : f.extensions)
      EXPECT_EQ(target_format(parse_target("dir/x" + std::string(e))), f.format);
  }
  EXPECT_EQ(target_format(parse_target("m.safetensors.index.json")), ConvertFormat::kSafetensors);
  TargetSettings s;
  s.alignment = 4096;
  s.meta = MetaTensors::kZeros;
  auto st = std::get<SafetensorsTarget>(parse_target("out.safetensors", s));
  EXPECT_EQ(st.alignment, 4096u);
  EXPECT_EQ(st.meta, MetaTensors::kZeros);
  // A setting of another format is refused by name, never ignored.
  Error e = test::capture_error([&] { parse_target("pt", s); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(
      e.message().find("TargetSettings::meta is only available for safetensors output, not pt"),
      std::string::npos)
      << e.message();
  TargetSettings a;
  a.alignment = 64;
  e = test::capture_error([&] { parse_target("x.tensors", a); });
  EXPECT_NE(e.message().find("TargetSettings::alignment is only available for pt and "
                             "safetensors output, not tensorizer"),
            std::string::npos)
      << e.message();
  TargetSettings d;
  d.dcp_files = 3;
  EXPECT_EQ(std::get<DcpTarget>(parse_target("dcp", d)).files, 3u);
  EXPECT_CKPT_ERROR(parse_target("x.pt", d), ErrorCode::kInvalidArgument);
  TargetSettings k;
  k.encryption.password = "pw";
  EXPECT_CKPT_ERROR(parse_target("safetensors", k), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(parse_target("model"), ErrorCode::kInvalidArgument);
}

// A state dict whose "encoder.weight" and "decoder.weight" are one tensor (torch.save writes it
// once), plus a transposed view of another tensor's storage.
std::string tied_checkpoint(const TempDir& dir) {
  std::vector<Tensor> ts = {make_tensor("w", DType::kFloat32, {4, 3}, 1),
                            make_tensor("b", DType::kFloat32, {3}, 2)};
  TensorInfo tr = ts[0].info();
  tr.name = "w_t";
  tr.shape = {3, 4};
  tr.strides = {1, 3};
  ts.emplace_back(tr, ts[0].storage());
  auto root = Value::ordered_dict();
  root->set("encoder.weight", Value::tensor(0));
  root->set("encoder.bias", Value::tensor(1));
  root->set("decoder.weight", Value::tensor(0));
  root->set("encoder.weight_t", Value::tensor(2));
  std::string path = dir.file("tied.pt");
  SaveOptions o;
  o.fsync = false;
  save_torch(path, root, ts, o);
  return path;
}

TEST(Convert, FlattenListsTiedNamesAndSharing) {
  TempDir dir;
  Checkpoint c = Checkpoint::open(tied_checkpoint(dir));
  ASSERT_EQ(c.tensors().size(), 3u);
  FlatStateDict f = flatten_state_dict(c);
  ASSERT_EQ(f.entries.size(), 4u);
  EXPECT_EQ(f.entries[0].name, "encoder.weight");
  EXPECT_EQ(f.entries[1].name, "encoder.bias");
  EXPECT_EQ(f.entries[2].name, "encoder.weight_t");
  EXPECT_EQ(f.entries[3].name, "decoder.weight");  // the alias, after the tensors
  EXPECT_EQ(f.entries[3].tensor, f.entries[0].tensor);
  EXPECT_EQ(f.entries[3].alias_of, std::optional<size_t>(0));
  EXPECT_FALSE(f.entries[2].alias_of);
  EXPECT_FALSE(f.entries[0].shares_with);
  EXPECT_FALSE(f.entries[1].shares_with);
  EXPECT_EQ(f.entries[2].shares_with, std::optional<size_t>(0));  // a view of w's storage
  EXPECT_EQ(f.entries[3].shares_with, std::optional<size_t>(0));
  // An OrderedDict's _metadata is structure a flat format drops.
  EXPECT_EQ(f.non_tensors, std::vector<std::string>{});
}

TEST(Convert, SharedAndTiedTensorsAreRefusedOrCopiedPerOption) {
  TempDir dir;
  Checkpoint c = Checkpoint::open(tied_checkpoint(dir));
  const std::string st = dir.file("t.safetensors");
  Error e = test::capture_error([&] { convert(c, st, quick()); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("copy_shared"), std::string::npos) << e.what();
  EXPECT_EQ(e.record(), "encoder.weight_t");
  EXPECT_FALSE(std::filesystem::exists(st));
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"tied.pt"});

  ConvertOptions o = quick();
  o.target = SafetensorsTarget{.copy_shared = true};
  ConvertReport r = convert(c, st, o);
  EXPECT_EQ(r.tensors, 4u);
  ASSERT_EQ(r.copied_shared.size(), 2u);
  EXPECT_EQ(r.copied_shared[0],
            std::make_pair(std::string("encoder.weight_t"), std::string("encoder.weight")));
  EXPECT_EQ(r.copied_shared[1],
            std::make_pair(std::string("decoder.weight"), std::string("encoder.weight")));
  auto got = contents(Checkpoint::open(st));
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got["decoder.weight"], got["encoder.weight"]);
  EXPECT_EQ(got["encoder.weight_t"].shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(got["encoder.weight_t"].bytes, c.tensor(2).contiguous_bytes());  // written contiguous

  // tensorizer has no sharing either: copies, reported.
  r = convert(c, dir.file("t.tensors"), quick());
  EXPECT_EQ(r.copied_shared.size(), 2u);
  EXPECT_EQ(contents(Checkpoint::open(dir.file("t.tensors"))), got);

  // pt keeps the sharing: one storage, the alias under its own key.
  r = convert(c, dir.file("t2.pt"), quick());
  Checkpoint back = Checkpoint::open(dir.file("t2.pt"));
  EXPECT_EQ(back.storages().size(), 2u);
  EXPECT_EQ(flatten_state_dict(back).entries.size(), 4u);
}

// An unmapped checkpoint (pread) is streamed to the writer in its order through a ring of
// memory_budget bytes: a budget below every tensor holds each alone, and the output is the same
// as from the mapped file, tied tensors and digests included.
TEST(Convert, StreamedConversionWithABudgetBelowEveryTensorWritesTheSameBytes) {
  TempDir dir;
  const auto ts = sample_tensors();
  const std::string src = dir.file("src.pt");
  write_source(ConvertFormat::kTorch, src, ts);
  OpenOptions pread;
  pread.mmap = false;
  Checkpoint mapped = Checkpoint::open(src), unmapped = Checkpoint::open(src, pread);
  for (ConvertFormat to : kFormats) {
    SCOPED_TRACE(convert_format_name(to));
    ConvertOptions o = quick();
    o.memory_budget = 1;
    const std::string out = dir.file(std::string("out") + ext_of(to));  // one name: pt's folder
    convert(mapped, out, quick());
    const std::vector<std::byte> from_mapping = test::read_file(out);
    ConvertReport r = convert(unmapped, out, o);
    EXPECT_EQ(r.tensors, ts.size());
    EXPECT_EQ(test::read_file(out), from_mapping);
    EXPECT_EQ(contents(Checkpoint::open(out)), contents(ts));
  }
  // Digests: the streamed input is read twice, the digests are the same.
  ConvertOptions d = quick();
  d.memory_budget = 1;
  d.target = SafetensorsTarget{.store_digests = true};
  convert(unmapped, dir.file("d1.safetensors"), d);
  d.memory_budget = 128ull << 20;
  convert(mapped, dir.file("d2.safetensors"), d);
  EXPECT_EQ(test::read_file(dir.file("d1.safetensors")),
            test::read_file(dir.file("d2.safetensors")));
  // Tied tensors: one storage read for consecutive names, copies where asked, sharing in pt.
  Checkpoint tied = Checkpoint::open(tied_checkpoint(dir), pread);
  ConvertOptions c = quick();
  c.memory_budget = 1;
  c.target = SafetensorsTarget{.copy_shared = true};
  convert(tied, dir.file("t.safetensors"), c);
  auto got = contents(Checkpoint::open(dir.file("t.safetensors")));
  EXPECT_EQ(got["decoder.weight"], got["encoder.weight"]);
  EXPECT_EQ(got["encoder.weight_t"].bytes, tied.tensor(2).contiguous_bytes());
  c.target = PtTarget{};
  convert(tied, dir.file("t.pt"), c);
  EXPECT_EQ(Checkpoint::open(dir.file("t.pt")).storages().size(), 2u);
}

TEST(Convert, TreesDeeperThan200AreWalkedWholeOrRefusedPerLimits) {
  TempDir dir;
  std::vector<Tensor> ts = {make_tensor("x", DType::kFloat32, {5}, 9)};
  constexpr int kDepth = 500;
  ValuePtr v = Value::list({Value::tensor(0), Value::real(1.5)});
  for (int i = 0; i < kDepth; ++i) v = Value::list({v});
  auto root = Value::dict();
  root->set("deep", v);
  root->set("top", Value::tensor(0));  // the same tensor again, after the deep path
  const std::string src = dir.file("deep.pt");
  SaveOptions so;
  so.fsync = false;
  save_torch(src, root, ts, so);

  std::string deep = "deep";
  for (int i = 0; i < kDepth; ++i) deep += ".0";
  Checkpoint c = Checkpoint::open(src);
  ASSERT_EQ(c.tensors().size(), 1u);
  EXPECT_EQ(c.tensors()[0].name, deep + ".0");
  FlatStateDict f = flatten_state_dict(c);
  ASSERT_EQ(f.entries.size(), 2u);
  EXPECT_EQ(f.entries[0].name, deep + ".0");
  EXPECT_EQ(f.entries[1].name, "top");  // reached only past the deep subtree
  EXPECT_EQ(f.non_tensors, std::vector<std::string>{deep + ".1"});

  ConvertOptions o = quick();
  o.target = SafetensorsTarget{.copy_shared = true};
  ConvertReport r = convert(c, dir.file("deep.safetensors"), o);
  EXPECT_EQ(r.not_written, std::vector<std::string>{deep + ".1"});
  auto got = contents(Checkpoint::open(dir.file("deep.safetensors")));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[deep + ".0"], got["top"]);

  // A bound below the depth is refused, naming the limit, and writes nothing.
  o.limits = Limits{};
  o.limits->max_pickle_depth = 300;
  Error e = test::capture_error([&] { convert(c, dir.file("shallow.tensors"), o); });
  EXPECT_EQ(e.code(), ErrorCode::kLimitExceeded);
  EXPECT_NE(std::string(e.what()).find("Limits::max_pickle_depth"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.file("shallow.tensors")));
  FlattenOptions fo;
  fo.limits = o.limits;
  EXPECT_CKPT_ERROR(flatten_state_dict(c, fo), ErrorCode::kLimitExceeded);
  fo.limits->max_pickle_depth = kDepth + 2;  // the tensor sits at depth 502
  EXPECT_EQ(flatten_state_dict(c, fo).entries.size(), 2u);
  fo.limits->max_pickle_depth = kDepth + 1;
  EXPECT_CKPT_ERROR(flatten_state_dict(c, fo), ErrorCode::kLimitExceeded);

  // pt keeps the whole tree.
  convert(c, dir.file("deep2.pt"), quick());
  EXPECT_EQ(flatten_state_dict(Checkpoint::open(dir.file("deep2.pt"))).entries.size(), 2u);
}

TEST(Convert, NonTensorValuesAreReported) {
  TempDir dir;
  std::vector<Tensor> ts = {make_tensor("w", DType::kFloat32, {2}, 1)};
  auto sd = Value::ordered_dict();
  sd->set("w", Value::tensor(0));
  auto root = Value::dict();
  root->set("model", sd);
  root->set("epoch", Value::integer(3));
  root->set("opt", Value::dict());  // empty: structure a flat format loses
  root->set("names", Value::list({Value::string("a"), Value::none()}));
  const std::string src = dir.file("c.pt");
  save_torch(src, root, ts);
  Checkpoint c = Checkpoint::open(src);
  ConvertReport r = convert(c, dir.file("c.safetensors"), quick());
  EXPECT_EQ(r.not_written, (std::vector<std::string>{"epoch", "opt", "names.0", "names.1"}));
  EXPECT_EQ(r.tensors, 1u);
}

// A sink that records which of its fast paths were used.
class RecordingSink final : public ByteSink {
 public:
  explicit RecordingSink(std::string name) : mem_(std::move(name)) {}
  const std::string& name() const override { return mem_.name(); }
  void write(std::span<const std::byte> b) override { mem_.write(b); }
  using ByteSink::write;
  void patch(uint64_t off, std::span<const std::byte> b) override { mem_.patch(off, b); }
  uint64_t position() const override { return mem_.position(); }
  void reserve(uint64_t n) override { reserved += n; }
  void write_sliced(std::span<const std::byte> b, size_t slice, const SliceVisitor& v) override {
    ++sliced;
    ByteSink::write_sliced(b, slice, v);
  }
  void commit() override { ++commits; }
  uint64_t reserved = 0;
  int sliced = 0, commits = 0;
  MemorySink mem_;
};

TEST(Convert, ProgressReachesTotalWithoutHidingTheSinksFastPaths) {
  TempDir dir;
  Checkpoint c = torch_source(dir);
  const auto caller = std::this_thread::get_id();
  for (ConvertFormat to : kFormats) {
    SCOPED_TRACE(convert_format_name(to));
    std::vector<std::pair<uint64_t, uint64_t>> calls;
    bool other_thread = false;
    ConvertOptions o = quick();
    o.progress_interval = std::chrono::milliseconds(0);
    o.progress = [&](uint64_t done, uint64_t total) {
      calls.emplace_back(done, total);
      if (std::this_thread::get_id() != caller) other_thread = true;
    };
    RecordingSink sink(std::string("p") + ext_of(to));
    ConvertReport r = convert(c, sink, o);
    EXPECT_EQ(sink.commits, 1);
    ASSERT_GE(calls.size(), 3u);
    EXPECT_FALSE(other_thread);
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_LE(calls[i].first, calls[i].second);
      if (i) EXPECT_GE(calls[i].first, calls[i - 1].first);
    }
    EXPECT_EQ(calls.back().first, sink.position());
    EXPECT_EQ(calls.back().second, sink.position());
    EXPECT_EQ(r.bytes_written, sink.position());
    // The progress wrapper passes the fast paths on.
    if (to != ConvertFormat::kTensorizer) EXPECT_GT(sink.reserved, 0u);
    if (to == ConvertFormat::kTorch) EXPECT_GE(sink.sliced, 2);  // big, mid
    // Same bytes as without progress.
    MemorySink plain(sink.name());
    convert(c, plain, quick());
    EXPECT_EQ(plain.bytes(), sink.mem_.bytes());
  }

  // Through a file, with the default interval: at least the final call, equal to the size.
  uint64_t last_done = 0, last_total = 1;
  ConvertOptions o = quick();
  o.progress = [&](uint64_t d, uint64_t t) { last_done = d, last_total = t; };
  convert(c, dir.file("f.pt"), o);
  EXPECT_EQ(last_done, std::filesystem::file_size(dir.file("f.pt")));
  EXPECT_EQ(last_total, last_done);
}

TEST(Convert, FailuresLeaveNoFileAndKeepTheOldOne) {
  TempDir dir;
  std::vector<Tensor> ts = {make_tensor("z", DType::kComplex128, {3}, 1)};
  const std::string src = dir.file("z.pt");
  save_torch(src, state_dict_value(ts), ts);
  Checkpoint c = Checkpoint::open(src);
  // No safetensors code for complex128.
  EXPECT_CKPT_ERROR(convert(c, dir.file("z.safetensors"), quick()), ErrorCode::kUnsupported);
  // Unknown extension. (Encryption for a target without it cannot be asked for: only
  // TensorizerTarget has it.)
  EXPECT_CKPT_ERROR(convert(c, dir.file("z.npz"), quick()), ErrorCode::kInvalidArgument);
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"z.pt"});

  // A progress callback that throws aborts the write: the old output stays as it was.
  const std::string out = dir.file("out.pt");
  test::write_file(out, test::to_bytes("old"));
  std::vector<Tensor> big = {make_tensor("big", DType::kFloat32, {1 << 22}, 2)};
  save_torch(dir.file("big.pt"), state_dict_value(big), big);
  Checkpoint cb = Checkpoint::open(dir.file("big.pt"));
  ConvertOptions o = quick();
  o.progress_interval = std::chrono::milliseconds(0);
  o.progress = [](uint64_t done, uint64_t) {
    if (done > (1 << 20)) throw std::runtime_error("cancelled");
  };
  EXPECT_THROW(convert(cb, out, o), std::runtime_error);
  EXPECT_EQ(test::read_file(out), test::to_bytes("old"));
  EXPECT_EQ(files_in(dir.path()), (std::vector<std::string>{"big.pt", "out.pt", "z.pt"}));

  // A bare tensor has no name for a flat format.
  const std::string bare = dir.file("bare.pt");
  save_torch(bare, Value::tensor(0), big);
  Error e = test::capture_error([&] { convert(Checkpoint::open(bare), dir.file("b.tensors")); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("unnamed"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.file("b.tensors")));
}

TEST(Convert, TensorizerEncryptionWithANewKeyFile) {
  TempDir dir;
  const auto ts = sample_tensors();
  const std::string src = dir.file("src.safetensors");
  write_source(ConvertFormat::kSafetensors, src, ts);
  Checkpoint c = Checkpoint::open(src);
  ConvertOptions o = quick();
  TensorizerSaveOptions tz;
  tz.key_file = dir.file("new.key");
  o.target = tz;
  ConvertReport r = convert(c, dir.file("e.tensors"), o);
  EXPECT_TRUE(r.key_file_written);
  ASSERT_EQ(r.key.size(), 32u);
  std::ifstream kf(dir.file("new.key"));
  std::string hex;
  std::getline(kf, hex);
  EXPECT_EQ(hex.size(), 64u);

  OpenOptions oo;
  oo.decrypt_key = hex;
  EXPECT_EQ(contents(Checkpoint::open(dir.file("e.tensors"), oo)), contents(ts));
  EXPECT_CKPT_ERROR(Checkpoint::open(dir.file("e.tensors")).tensor(0), ErrorCode::kAuth);

  // The same key file again: read, not replaced.
  r = convert(c, dir.file("e2.tensors"), o);
  EXPECT_FALSE(r.key_file_written);
  EXPECT_EQ(contents(Checkpoint::open(dir.file("e2.tensors"), oo)), contents(ts));

  ConvertOptions two = quick();
  TensorizerSaveOptions both;
  both.key = hex;
  both.password = "pw";
  two.target = both;
  EXPECT_CKPT_ERROR(convert(c, dir.file("e3.tensors"), two), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir.file("e3.tensors")));
}

}  // namespace
}  // namespace ckpt
