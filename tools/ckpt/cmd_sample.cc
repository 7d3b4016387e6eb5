// ckpt sample OUT [--size-mb N] [--dtype float32|bfloat16|float16]: writes a transformer-like
// state dict with ckpt's own writer (used by `make demo` and the benchmarks).

#include <cstdio>
#include <cstring>

#include "common.h"

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
        if (exp <= 0) h = static_cast<uint16_t>(sign | ((man | 0x800000) >> (14 - exp)));
        else h = static_cast<uint16_t>(sign | (exp << 10) | (man >> 13));
      }
      std::memcpy(p + 2 * i, &h, 2);
    }
  }
}

}  // namespace

void add_sample(CLI::App& app) {
  struct Opts {
    std::string out, dtype = "float32";
    double size_mb = 256;
    int hidden = 768;
    int tensors = 0;
    uint32_t align = 64;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("sample", "write a generated transformer-like checkpoint");
  cmd->add_option("OUT", o->out, "output .pt file")->required();
  cmd->add_option("--size-mb", o->size_mb, "approximate size in MiB (default 256)");
  cmd->add_option("--dtype", o->dtype, "float32, bfloat16 or float16");
  cmd->add_option("--hidden", o->hidden, "hidden size (default 768)");
  cmd->add_option("--tensors", o->tensors,
                  "instead of a transformer: this many equal float32 tensors filling --size-mb");
  cmd->add_option("--align", o->align, "record alignment (default 64)");
  cmd->callback([o] {
    auto dt = dtype_from_name(o->dtype);
    if (!dt || (*dt != DType::kFloat32 && *dt != DType::kBFloat16 && *dt != DType::kFloat16))
      throw Error(ErrorCode::kInvalidArgument, "--dtype must be float32, bfloat16 or float16");
    uint64_t budget = static_cast<uint64_t>(o->size_mb * 1024 * 1024);
    std::vector<std::pair<std::string, std::vector<int64_t>>> specs;
    if (o->tensors > 0) {
      uint64_t per = budget / o->tensors / dtype_size(*dt);
      int64_t cols = 256;
      int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(per / cols));
      for (int i = 0; i < o->tensors; ++i)
        specs.push_back({"blocks." + std::to_string(i) + ".weight", {rows, cols}});
    } else {
      int64_t h = o->hidden, vocab = 32000, inter = h * 8 / 3 / 64 * 64;
      uint64_t es = dtype_size(*dt);
      uint64_t fixed = 2 * vocab * h * es + h * es;
      uint64_t per_layer = (4 * h * h + 3 * h * inter + 2 * h) * es;
      int layers = budget > fixed ? static_cast<int>((budget - fixed) / per_layer) : 1;
      layers = std::max(layers, 1);
      specs.push_back({"model.embed_tokens.weight", {vocab, h}});
      for (int l = 0; l < layers; ++l) {
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
    }
    double t0 = now_seconds();
    std::vector<Tensor> tensors;
    uint64_t total = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      uint64_t numel = 1;
      for (int64_t d : specs[i].second) numel *= d;
      auto buf = std::make_shared<std::vector<std::byte>>(numel * dtype_size(*dt));
      fill(buf->data(), numel, *dt, i + 1);
      total += buf->size();
      tensors.push_back(Tensor::from_bytes(specs[i].first, *dt, specs[i].second,
                                           std::span<const std::byte>(*buf), buf));
    }
    double t1 = now_seconds();
    SaveOptions so;
    so.alignment = o->align;
    save_torch(o->out, state_dict_value(tensors), tensors, so);
    double t2 = now_seconds();
    std::printf("wrote %s: %zu tensors, %s (generated in %.2f s, saved in %.2f s: %.2f GB/s)\n",
                o->out.c_str(), tensors.size(), human_bytes(total).c_str(), t1 - t0, t2 - t1,
                total / (t2 - t1) / 1e9);
  });
}

}  // namespace ckpt::cli
