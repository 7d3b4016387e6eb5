// The dry run of a rank's load: the plan resolved against the checkpoint, printed.

#include "rank_plan_print.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace ckpt::cli {
namespace {

RankPlan read_plan(const std::string& path) {
  if (path.empty()) return RankPlan{};
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kNotFound, "cannot open the plan file", path);
  std::stringstream text;
  text << in.rdbuf();
  return RankPlan::from_json(text.str(), path);
}

std::string box_str(const RankTensor& t) {
  std::string s;
  for (size_t d = 0; d < t.begin.size(); ++d)
    s += (d ? "x[" : "[") + std::to_string(t.begin[d]) + "," + std::to_string(t.end[d]) + ")";
  return s.empty() ? "[]" : s;
}

nlohmann::ordered_json tensor_json(const Checkpoint& c, const RankTensor& t) {
  nlohmann::ordered_json ranges = nlohmann::ordered_json::array();
  for (const FileRange& r : t.ranges)
    ranges.push_back({{"file", c.files()[r.file]}, {"offset", r.offset}, {"length", r.length}});
  nlohmann::ordered_json j{{"name", c.tensors()[t.tensor].name},
                           {"placement", t.placement.str()},
                           {"begin", t.begin},
                           {"end", t.end},
                           {"bytes", t.nbytes},
                           {"exact", t.exact}};
  j["ranges"] = std::move(ranges);
  return j;
}

// Text: one line per tensor, its first ranges (all of them when few).
void print_text(const Checkpoint& c, const RankLoadPlan& p) {
  constexpr size_t kShown = 4;
  for (const RankTensor& t : p.tensors) {
    std::printf("%s  %s  %s  %s", printable(c.tensors()[t.tensor].name).c_str(),
                t.placement.str().c_str(), box_str(t).c_str(), human_bytes(t.nbytes).c_str());
    if (!t.exact) {
      std::printf("  (decoded or assembled: read through the format)\n");
      continue;
    }
    std::printf("  %zu range%s:", t.ranges.size(), t.ranges.size() == 1 ? "" : "s");
    for (size_t i = 0; i < t.ranges.size() && i < kShown; ++i)
      std::printf(" %s@%llu+%llu",
                  c.files().size() > 1 ? std::to_string(t.ranges[i].file).c_str() : "",
                  static_cast<unsigned long long>(t.ranges[i].offset),
                  static_cast<unsigned long long>(t.ranges[i].length));
    std::printf("%s\n", t.ranges.size() > kShown ? " ..." : "");
  }
}

}  // namespace

void print_rank_plan(const std::vector<std::string>& files, const Common& common,
                     const RankDryRun& run) {
  RankPlan plan = read_plan(run.plan_file);
  Checkpoint c = open_checkpoint(files, common);
  RankLoadPlan p = resolve(c, plan, run.rank, run.world);
  uint64_t model = 0;
  for (const TensorInfo& t : c.tensors()) model += t.nbytes();
  if (run.json) {
    nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
    for (const RankTensor& t : p.tensors) tensors.push_back(tensor_json(c, t));
    nlohmann::ordered_json j{{"rank", run.rank},
                             {"world", run.world},
                             {"files", c.files()},
                             {"tensors", std::move(tensors)},
                             {"read_bytes", p.read_bytes()},
                             {"model_bytes", model}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  print_text(c, p);
  std::printf("rank %d of %d reads %s of %s (%zu tensors)\n", run.rank, run.world,
              human_bytes(p.read_bytes()).c_str(), human_bytes(model).c_str(), p.tensors.size());
}

}  // namespace ckpt::cli
