// _ckpt.load_ranks / _ckpt.resolve_ranks: a rank plan (rules from python/ckpt/_ranks.py) resolved
// and loaded for one rank, the group's exchange a Python callable over torch.distributed.

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "binding.h"

namespace ckpt::py {
namespace {

// (pattern, match: "exact"|"glob"|"regex", placement: "replicate"|"shard"|"box", dim, begin, end)
using PyRule = std::tuple<std::string, std::string, std::string, int, std::vector<int64_t>,
                          std::vector<int64_t>>;
// (placement, dim, begin, end), or None: no default.
using PyPlacement = std::tuple<std::string, int, std::vector<int64_t>, std::vector<int64_t>>;

Placement placement_of(const std::string& kind, int dim, std::vector<int64_t> begin,
                       std::vector<int64_t> end) {
  if (kind == "replicate") return Placement::replicate();
  if (kind == "shard") return Placement::shard(dim);
  if (kind == "box") return Placement::box(std::move(begin), std::move(end));
  throw Error(ErrorCode::kInvalidArgument, "no placement \"" + kind + "\"");
}

RankPlan plan_of(const std::vector<PyRule>& rules, const std::optional<PyPlacement>& dflt) {
  RankPlan plan;
  for (const auto& [pattern, match, kind, dim, begin, end] : rules) {
    RankPlan::Match m = match == "exact"   ? RankPlan::Match::kExact
                        : match == "regex" ? RankPlan::Match::kRegex
                                           : RankPlan::Match::kGlob;
    plan.add(pattern, placement_of(kind, dim, begin, end), m);
  }
  if (dflt)
    plan.set_default(placement_of(std::get<0>(*dflt), std::get<1>(*dflt), std::get<2>(*dflt),
                                  std::get<3>(*dflt)));
  else
    plan.set_default(std::nullopt);
  return plan;
}

// One round of the group's exchange, in place: fn(round, cuts, ptr) called with the GIL held,
// `round` a memoryview of host memory (ptr None), or None and `ptr` the device address of a
// device load's round. A Python exception becomes a C++ one carrying its text (load_group names
// the tensors).
class PyExchange final : public RankExchange {
 public:
  PyExchange(int rank, int world, pyb::function fn)
      : rank_(rank), world_(world), fn_(std::move(fn)) {}
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void gather_parts(std::span<std::byte> round, std::span<const uint64_t> cuts,
                    const Device& device) override {
    pyb::gil_scoped_acquire gil;
    try {
      pyb::list at;
      for (uint64_t c : cuts) at.append(c);
      if (device.is_cpu())
        fn_(pyb::memoryview::from_memory(round.data(), static_cast<ssize_t>(round.size()), false),
            at, pyb::none());
      else
        fn_(pyb::none(), at, reinterpret_cast<uintptr_t>(round.data()));
    } catch (pyb::error_already_set& e) {
      // The exception's type and text, not its traceback.
      throw std::runtime_error(std::string(pyb::str(e.type().attr("__name__"))) + ": " +
                               std::string(pyb::str(e.value())));
    }
  }

 private:
  int rank_, world_;
  pyb::function fn_;
};

pyb::list tensors_out(const Checkpoint& c, const std::vector<Tensor>& loaded) {
  pyb::list out;
  SpanMaker spans;
  for (const Tensor& t : loaded) {
    const HandOff h = hand_off(t.storage());  // host or device memory
    auto span = pyb::reinterpret_steal<pyb::object>(spans.make(h, true));
    out.append(pyb::make_tuple(t.name(), dtype_str(t.dtype()), int_tuple(t.shape()), span));
  }
  return out;
}

}  // namespace

void bind_ranks(pyb::module_& m) {
  m.def("resolve_ranks", [](const PyCheckpoint& p, const std::vector<PyRule>& rules,
                            const std::optional<PyPlacement>& dflt, int rank, int world) {
    RankLoadPlan plan = resolve(p.c, plan_of(rules, dflt), rank, world);
    pyb::list out;
    for (const RankTensor& t : plan.tensors)
      out.append(pyb::make_tuple(p.c.tensors()[t.tensor].name, t.placement.str(), t.begin, t.end,
                                 t.nbytes, t.exact));
    return pyb::make_tuple(out, plan.read_bytes());
  });
  // Every tensor's box for this rank on `device` ("cpu", "cuda[:N]"): a list of (name, dtype,
  // shape, Span). With `gather` (a callable fn(round, cuts, ptr): PyExchange), Replicate tensors
  // are read once across the group (load_group).
  m.def("load_ranks", [](const PyCheckpoint& p, const std::vector<PyRule>& rules,
                         const std::optional<PyPlacement>& dflt, int rank, int world,
                         const std::optional<pyb::function>& gather, uint64_t budget, bool verify,
                         const std::string& device) {
    RankLoadPlan plan = resolve(p.c, plan_of(rules, dflt), rank, world);
    LoadOptions lo = load_options(verify, 0, device);
    std::vector<Tensor> loaded;
    if (gather) {
      PyExchange ex(rank, world, *gather);
      pyb::gil_scoped_release nogil;
      loaded = load_group(p.c, plan, ex, budget, lo);
    } else {
      pyb::gil_scoped_release nogil;
      loaded = load_rank(p.c, plan, lo);
    }
    return tensors_out(p.c, loaded);
  });
  m.def(
      "process_bytes_read", [] { return process_bytes_read(); },
      "Bytes read through every source of this process so far (tests, benchmarks).");
}

}  // namespace ckpt::py
