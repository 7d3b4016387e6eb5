// ckpt sample OUT [--size-mb N] [--dtype float32|bfloat16|float16] [--to FORMAT]: writes a
// transformer-like state dict of about --size-mb MiB with ckpt's own writers, in the format OUT's
// extension names (used by `make demo`, the benchmarks and the tests).

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "ckpt/convert.h"
#include "common.h"
#include "progress.h"

namespace ckpt::cli {
namespace {

// Deterministic pseudo-random weights in [-0.05, 0.05).
void fill(std::byte* p, uint64_t numel, DType dtype, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i < numel; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    float f = (static_cast<float>(x >> 40) / static_cast<float>(1 << 24) - 0.5f) * 0.1f;
    if (dtype == DType::kFloat32) {
      std::memcpy(p + 4 * i, &f, 4);
    } else {
      uint32_t w;
      std::memcpy(&w, &f, 4);
      uint16_t h;
      if (dtype == DType::kBFloat16) {
        h = static_cast<uint16_t>((w + 0x7fff + ((w >> 16) & 1)) >> 16);
      } else {  // float16, |f| < 0.05: normal or subnormal range, no overflow
        uint32_t sign = (w >> 16) & 0x8000;
        int exp = static_cast<int>((w >> 23) & 0xff) - 127 + 15;
        uint32_t man = w & 0x7fffff;
        if (exp <= 0)
          h = static_cast<uint16_t>(sign | ((man | 0x800000) >> (14 - exp)));
        else
          h = static_cast<uint16_t>(sign | (exp << 10) | (man >> 13));
      }
      std::memcpy(p + 2 * i, &h, 2);
    }
  }
}

}  // namespace

namespace {

using Spec = std::pair<std::string, std::vector<int64_t>>;

// A Llama-like layout of about `budget` bytes: the hidden size is halved (to at least 64) until a
// layer is at most an eighth of the budget, layers fill three quarters of it, and the embedding
// and output matrices take the rest, so the total lands within a row of the budget (never below
// one layer: ~160 KiB in float32).
std::vector<Spec> transformer(uint64_t budget, int64_t hidden, uint64_t es) {
  auto inter_of = [](int64_t h) { return std::max<int64_t>(64, h * 8 / 3 / 64 * 64); };
  auto layer_bytes = [&](int64_t h) {
    return static_cast<uint64_t>(4 * h * h + 3 * h * inter_of(h) + 2 * h) * es;
  };
  int64_t h = hidden;
  while (h > 64 && layer_bytes(h) > budget / 8) h = std::max<int64_t>(64, h / 2 / 64 * 64);
  const int64_t inter = inter_of(h);
  const uint64_t per_layer = layer_bytes(h);
  const uint64_t layers = std::max<uint64_t>(1, budget * 3 / 4 / per_layer);
  const uint64_t used = layers * per_layer + static_cast<uint64_t>(h) * es;
  const int64_t vocab = std::max<int64_t>(
      1, used < budget ? static_cast<int64_t>((budget - used) / (2 * static_cast<uint64_t>(h) * es))
                       : 1);
  std::vector<Spec> specs;
  specs.push_back({"model.embed_tokens.weight", {vocab, h}});
  for (uint64_t l = 0; l < layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"})
      specs.push_back({p + "self_attn." + n + ".weight", {h, h}});
    specs.push_back({p + "mlp.gate_proj.weight", {inter, h}});
    specs.push_back({p + "mlp.up_proj.weight", {inter, h}});
    specs.push_back({p + "mlp.down_proj.weight", {h, inter}});
    specs.push_back({p + "input_layernorm.weight", {h}});
    specs.push_back({p + "post_attention_layernorm.weight", {h}});
  }
  specs.push_back({"model.norm.weight", {h}});
  specs.push_back({"lm_head.weight", {vocab, h}});
  return specs;
}

struct SampleOptions {
  std::string out, dtype = "float32", to;
  double size_mb = 256;
  int hidden = 768;
  int tensors = 0;
  uint32_t align = 0;
  ProgressMode progress = ProgressMode::kAuto;
};

// The tensors to generate: --tensors equal blocks, else a transformer of --hidden.
std::vector<Spec> sample_specs(const SampleOptions& o, uint64_t budget, uint64_t es) {
  if (o.tensors <= 0) return transformer(budget, o.hidden, es);
  std::vector<Spec> specs;
  const uint64_t per = std::max<uint64_t>(1, budget / static_cast<uint64_t>(o.tensors) / es);
  const int64_t cols = static_cast<int64_t>(std::min<uint64_t>(256, per));
  const int64_t rows = static_cast<int64_t>(per / static_cast<uint64_t>(cols));
  for (int i = 0; i < o.tensors; ++i)
    specs.push_back({"blocks." + std::to_string(i) + ".weight", {rows, cols}});
  return specs;
}

// The tensors with the save function of the target's format.
void save_sample(ByteSink& sink, const std::vector<Tensor>& tensors, const ConvertTarget& target) {
  struct Save {
    ByteSink& sink;
    const std::vector<Tensor>& tensors;
    void operator()(const std::monostate&) const {}
    void operator()(const TorchSaveOptions& so) const {
      save_torch(sink, state_dict_value(tensors), tensors, so);
    }
    void operator()(const SafetensorsSaveOptions& so) const {
      save_safetensors(sink, tensors, {}, so);
    }
    void operator()(const TensorizerSaveOptions& so) const {
      std::vector<TensorizerEntry> entries;
      for (const Tensor& t : tensors) entries.push_back({.tensor = t});
      save_tensorizer(sink, entries, so);
    }
    void operator()(const DcpSaveOptions&) const {
      throw Error(ErrorCode::kInvalidArgument,
                  "sample writes one file: pt, safetensors or tensorizer");
    }
  };
  std::visit(Save{sink, tensors}, target);
}

void run_sample(const SampleOptions& o) {
  auto dt = dtype_from_name(o.dtype);
  if (!dt || (*dt != DType::kFloat32 && *dt != DType::kBFloat16 && *dt != DType::kFloat16))
    throw Error(ErrorCode::kInvalidArgument, "--dtype must be float32, bfloat16 or float16");
  // The library's table says which format OUT names and refuses --align for tensorizer.
  TargetSettings settings;
  settings.alignment = o.align;
  const ConvertTarget target = parse_target(o.to.empty() ? o.out : o.to, settings);
  const uint64_t es = dtype_size(*dt);
  const uint64_t budget = std::max<uint64_t>(static_cast<uint64_t>(o.size_mb * 1048576.0), es);
  std::vector<Spec> specs = sample_specs(o, budget, es);
  uint64_t total = 0;
  for (const auto& sp : specs) {
    uint64_t numel = 1;
    for (int64_t d : sp.second) numel *= static_cast<uint64_t>(d);
    total += numel * es;
  }
  ProgressLine line(o.progress, "generating");
  double t0 = now_seconds();
  std::vector<Tensor> tensors;
  uint64_t made = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    uint64_t numel = 1;
    for (int64_t d : specs[i].second) numel *= static_cast<uint64_t>(d);
    auto buf = std::make_shared<std::vector<std::byte>>(numel * es);
    fill(buf->data(), numel, *dt, i + 1);
    made += buf->size();
    line.update(made, total);
    tensors.push_back(Tensor::from_bytes(specs[i].first, *dt, specs[i].second,
                                         std::span<const std::byte>(*buf), buf));
  }
  double t1 = now_seconds();
  line.set_label("writing");
  auto file = create_file_sink(o.out);
  ProgressSink sink(
      *file, total, [&line](uint64_t done, uint64_t all) { line.update(done, all); },
      std::chrono::steady_clock::duration::zero());
  save_sample(sink, tensors, target);
  sink.commit();
  line.finish(file->position());
  double t2 = now_seconds();
  std::printf(
      "wrote %s (%s): %zu tensors, %s of data, %s file (generated in %.2f s, saved in "
      "%.2f s: %.2f GB/s)\n",
      o.out.c_str(), convert_format_name(target_format(target)), tensors.size(),
      human_bytes(total).c_str(), human_bytes(file->position()).c_str(), t1 - t0, t2 - t1,
      static_cast<double>(total) / (t2 - t1) / 1e9);
}

}  // namespace

void add_sample(CLI::App& app) {
  auto o = std::make_shared<SampleOptions>();
  auto* cmd = app.add_subcommand("sample", "write a generated transformer-like checkpoint");
  cmd->add_option("OUT", o->out,
                  "output file; its extension names the format (.pt/.pth/.bin, .safetensors, "
                  ".tensors)")
      ->required();
  cmd->add_option("--size-mb", o->size_mb, "approximate size in MiB (default 256)")
      ->check(more_than(0));
  cmd->add_option("--dtype", o->dtype, "float32, bfloat16 or float16");
  cmd->add_option("--hidden", o->hidden,
                  "hidden size (default 768; smaller when --size-mb is too small for it)")
      ->check(at_least(64));
  cmd->add_option("--tensors", o->tensors,
                  "instead of a transformer: this many equal tensors filling --size-mb")
      ->check(at_least(1));
  cmd->add_option("--to", o->to, "output format: pt, safetensors or tensorizer (default: from OUT)")
      ->check(CLI::IsMember({"pt", "safetensors", "tensorizer"}));
  cmd->add_option("--align", o->align,
                  "record alignment (pt: default 64; safetensors: default 8; not for tensorizer)");
  add_progress_flags(*cmd, o->progress);
  cmd->callback([o] { run_sample(*o); });
}

}  // namespace ckpt::cli
