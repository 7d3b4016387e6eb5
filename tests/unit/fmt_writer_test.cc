// The writer interface (src/formats/writer.h): what each target format declares it can hold,
// writers that never commit, and convert() refusing what a writer cannot hold before writing.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/ckpt.h"
#include "ckpt/convert.h"
#include "ckpt/torch.h"
#include "formats/writer.h"
#include "test_util.h"

namespace ckpt {
namespace {

using test::TempDir;

Tensor filled(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  uint64_t n = dtype_size(dtype);
  for (auto d : shape) n *= static_cast<uint64_t>(d);
  std::vector<std::byte> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::byte>(i * 7 + 1);
  return Tensor::copy_of(name, dtype, std::move(shape), bytes);
}

std::vector<std::unique_ptr<internal::Writer>> all_writers() {
  std::vector<std::unique_ptr<internal::Writer>> w;
  w.push_back(internal::make_torch_writer({}));
  w.push_back(internal::make_safetensors_writer({}));
  w.push_back(internal::make_tensorizer_writer({}));
  return w;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A sink that counts what reaches it.
class CountingSink final : public ByteSink {
 public:
  const std::string& name() const override { return name_; }
  void write(std::span<const std::byte> b) override { inner_.write(b); }
  using ByteSink::write;
  void patch(uint64_t off, std::span<const std::byte> b) override { inner_.patch(off, b); }
  uint64_t position() const override { return inner_.position(); }
  void commit() override { ++commits; }
  int commits = 0;

 private:
  std::string name_ = "out.safetensors";
  MemorySink inner_;
};

TEST(Writer, CapabilitiesPerFormat) {
  auto w = all_writers();
  const internal::WriterCaps& pt = w[0]->caps();
  const internal::WriterCaps& st = w[1]->caps();
  const internal::WriterCaps& tz = w[2]->caps();
  EXPECT_STREQ(pt.format, "pt");
  EXPECT_TRUE(pt.object_tree && pt.shared_bytes && pt.meta_tensors && pt.quantized && pt.sharded);
  EXPECT_FALSE(pt.metadata || pt.digests || pt.encryption || pt.patches || pt.several_files);
  EXPECT_STREQ(st.format, "safetensors");
  EXPECT_TRUE(st.metadata && st.digests && st.sharded);
  EXPECT_FALSE(st.object_tree || st.shared_bytes || st.copies_shared || st.meta_tensors ||
               st.encryption);
  EXPECT_FALSE(w[1]->copies_shared());
  EXPECT_TRUE(internal::make_safetensors_writer({.copy_shared = true})->copies_shared());
  EXPECT_FALSE(w[1]->holds(DType::kComplex128));
  EXPECT_TRUE(w[1]->holds(DType::kBFloat16));
  EXPECT_STREQ(tz.format, "tensorizer");
  EXPECT_TRUE(tz.copies_shared && tz.meta_tensors && tz.encryption && tz.patches);
  EXPECT_FALSE(tz.object_tree || tz.metadata || tz.sharded);
  EXPECT_FALSE(w[2]->encrypts());
  TensorizerSaveOptions enc;
  enc.encryption = TensorizerEncryption::kRandomKey;
  EXPECT_TRUE(internal::make_tensorizer_writer(enc)->encrypts());
}

TEST(Writer, NeverCommits) {
  TempDir dir;
  const char* names[] = {"a.pt", "a.safetensors", "a.tensors"};
  auto writers = all_writers();
  for (size_t k = 0; k < writers.size(); ++k) {
    SCOPED_TRACE(names[k]);
    const std::string path = dir.file(names[k]);
    internal::WriteContent content;
    content.tensors = {filled("w", DType::kFloat32, {4, 4})};
    {
      CountingSink counted;
      internal::SinkOutput out(counted);
      internal::WriteContent copy = content;
      writers[k]->write(out, copy);
      EXPECT_GT(counted.position(), 0u);
      EXPECT_EQ(counted.commits, 0);
    }
    {
      auto sink = create_file_sink(path, FileSinkOptions{true, false});
      internal::SinkOutput out(*sink);
      internal::WriteContent copy = content;
      writers[k]->write(out, copy);
    }  // not committed: nothing left, not even a temporary
    EXPECT_TRUE(files_in(dir.path()).empty());
    {
      auto sink = create_file_sink(path, FileSinkOptions{true, false});
      internal::SinkOutput out(*sink);
      internal::WriteContent copy = content;
      writers[k]->write(out, copy);
      sink->commit();
    }
    Checkpoint c = Checkpoint::open(path);
    ASSERT_EQ(c.tensors().size(), 1u);
    EXPECT_EQ(c.tensors()[0].name, "w");
    std::filesystem::remove(path);
  }
}

TEST(Writer, OneFileOutputRefusesNamedFiles) {
  MemorySink sink;
  internal::SinkOutput out(sink);
  EXPECT_EQ(&out.file(), &sink);
  EXPECT_CKPT_ERROR(out.file("x.bin"), ErrorCode::kInvalidArgument);
}

TEST(Writer, PublicSaveFunctionsIntoASinkNeverCommit) {
  // Every save_* function into a sink leaves the commit to the caller.
  std::vector<Tensor> t = {filled("w", DType::kFloat32, {2})};
  CountingSink a, b, c;
  save_torch(a, state_dict_value(t), t);
  save_safetensors(b, t);
  std::vector<TensorizerEntry> e(1);
  e[0].tensor = t[0];
  save_tensorizer(c, e);
  EXPECT_EQ(a.commits, 0);
  EXPECT_EQ(b.commits, 0);
  EXPECT_EQ(c.commits, 0);
}

// A checkpoint whose "b" is a view of "a"'s storage, and a complex128 tensor.
std::string shared_checkpoint(TempDir& dir, bool complex) {
  Tensor a = filled("a", DType::kFloat32, {8});
  Tensor b = a;
  b.info().name = "b";
  b.info().shape = {4};
  b.info().strides = {1};
  b.info().storage_offset = 4;
  std::vector<Tensor> t = {a, b};
  if (complex) t = {filled("z", DType::kComplex128, {2})};
  const std::string path = dir.file("in.pt");
  SaveOptions so;
  so.fsync = false;
  save_torch(path, state_dict_value(t), t, so);
  return path;
}

TEST(Writer, ConvertRefusesBeforeAnyByteIsWritten) {
  TempDir dir;
  Checkpoint shared = Checkpoint::open(shared_checkpoint(dir, false));
  // (An option of another format cannot be given: each target holds its own options.)
  struct Case {
    ConvertTarget target;
    ErrorCode code;
    const char* names;  // what the message names
  };
  TensorizerSaveOptions bad_key;
  bad_key.key = "short";
  std::vector<Case> cases = {
      {SafetensorsTarget{}, ErrorCode::kInvalidArgument, "copy_shared"},
      {bad_key, ErrorCode::kInvalidArgument, "key"},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.names);
    ConvertOptions o;
    o.target = k.target;
    CountingSink sink;
    Error e = test::capture_error([&] { convert(shared, sink, o); });
    EXPECT_EQ(e.code(), k.code);
    EXPECT_NE(std::string(e.what()).find(k.names), std::string::npos) << e.what();
    EXPECT_EQ(sink.position(), 0u);
    EXPECT_EQ(sink.commits, 0);
  }
  TempDir dir2;
  Checkpoint complex = Checkpoint::open(shared_checkpoint(dir2, true));
  CountingSink sink;
  ConvertOptions o;
  o.target = SafetensorsTarget{};
  Error e = test::capture_error([&] { convert(complex, sink, o); });
  EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  EXPECT_EQ(e.record(), "z");
  EXPECT_EQ(sink.position(), 0u);
  // The same checkpoints where the writer can hold them.
  o.target = PtTarget{};
  CountingSink ok;
  convert(complex, ok, o);
  EXPECT_GT(ok.position(), 0u);
  EXPECT_EQ(ok.commits, 1);  // convert commits, the writer does not
}

TEST(Writer, ShardsCheckTheRulesOfOneFile) {
  TempDir dir;
  Checkpoint shared = Checkpoint::open(shared_checkpoint(dir, false));
  ConvertOptions o;
  o.fsync = false;
  o.max_shard_size = 16;
  Error e = test::capture_error([&] { convert(shared, dir.file("s.safetensors"), o); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("copy_shared"), std::string::npos) << e.what();
  o.target = TensorizerTarget{};
  e = test::capture_error([&] { convert(shared, dir.file("s.tensors"), o); });
  EXPECT_NE(std::string(e.what()).find("max_shard_size"), std::string::npos) << e.what();
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"in.pt"});
}

// A writer of a folder of files (the shape a torch.distributed.checkpoint writer has): one
// safetensors file per tensor and a listing, through the same interface.
class FolderOfFilesWriter final : public internal::Writer {
 public:
  const internal::WriterCaps& caps() const override {
    static const internal::WriterCaps caps = [] {
      internal::WriterCaps c;
      c.format = "test-folder";
      c.several_files = true;
      return c;
    }();
    return caps;
  }
  bool holds(DType) const override { return true; }
  internal::WriteResult write(internal::WriteOutput& out,
                              internal::WriteContent& content) override {
    std::string listing;
    for (const Tensor& t : content.tensors) {
      save_safetensors(out.file(t.name() + ".safetensors"), {t});
      listing += t.name() + "\n";
    }
    out.file(".metadata").write(listing);
    return {};
  }
};

TEST(Writer, SeveralFilesIntoAFolderCommittedByTheCaller) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  FolderOfFilesWriter w;
  internal::WriteContent content;
  content.tensors = {filled("a", DType::kFloat32, {3}), filled("b", DType::kInt64, {2})};
  {
    auto sink = create_folder_sink(folder, FolderSinkOptions{false, false});
    internal::FolderOutput out(*sink);
    EXPECT_CKPT_ERROR(out.file(), ErrorCode::kInvalidArgument);
    w.write(out, content);
  }  // not committed: nothing left
  EXPECT_TRUE(files_in(dir.path()).empty());
  {
    auto sink = create_folder_sink(folder, FolderSinkOptions{false, false});
    internal::FolderOutput out(*sink);
    w.write(out, content);
    out.commit();
  }
  EXPECT_EQ(files_in(folder),
            (std::vector<std::string>{".metadata", "a.safetensors", "b.safetensors"}));
  EXPECT_EQ(Checkpoint::open(folder + "/b.safetensors").tensors()[0].dtype, DType::kInt64);
}

}  // namespace
}  // namespace ckpt
