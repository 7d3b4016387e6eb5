// RankPlan: placements, the rules that give each tensor one, and the plan file's JSON.

#include "ckpt/rank_plan.h"

#include <fnmatch.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "ckpt/error.h"

namespace ckpt {

std::string Placement::str() const {
  switch (kind) {
    case Kind::kReplicate:
      return "replicate";
    case Kind::kShard:
      return "shard:" + std::to_string(dim);
    case Kind::kBox: {
      std::string s = "box:";
      for (size_t d = 0; d < begin.size() && d < end.size(); ++d)
        s += (d ? "x[" : "[") + std::to_string(begin[d]) + "," + std::to_string(end[d]) + ")";
      return s;
    }
  }
  return "?";
}

Placement Placement::parse(std::string_view text) {
  if (text == "replicate") return replicate();
  if (text.starts_with("shard:")) {
    std::string_view n = text.substr(6);
    bool neg = !n.empty() && n[0] == '-';
    if (neg) n.remove_prefix(1);
    if (!n.empty() && n.size() < 4 && n.find_first_not_of("0123456789") == std::string_view::npos)
      return shard((neg ? -1 : 1) * std::stoi(std::string(n)));
  }
  throw Error(ErrorCode::kInvalidArgument,
              "a placement is \"replicate\" or \"shard:DIM\", not \"" + std::string(text) + "\"");
}

std::pair<int64_t, int64_t> shard_range(int64_t size, int rank, int world) {
  const int64_t chunk = (size + world - 1) / world;
  const int64_t b = std::min(size, chunk * rank);
  return {b, std::min(size, b + chunk)};
}

struct RankPlan::Rule {
  std::string pattern;
  Match match;
  Placement placement;
  std::regex re;

  bool matches(std::string_view name) const {
    switch (match) {
      case Match::kExact:
        return name == pattern;
      case Match::kGlob:
        return ::fnmatch(pattern.c_str(), std::string(name).c_str(), 0) == 0;
      case Match::kRegex:
        return std::regex_match(name.begin(), name.end(), re);
    }
    return false;
  }
};

RankPlan& RankPlan::add(std::string pattern, Placement placement, Match match) {
  auto r = std::make_shared<Rule>();
  if (match == Match::kRegex) {
    try {
      r->re = std::regex(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw Error(ErrorCode::kInvalidArgument,
                  "the pattern \"" + pattern + "\" is not a regular expression: " + e.what());
    }
  }
  r->pattern = std::move(pattern);
  r->match = match;
  r->placement = std::move(placement);
  rules_.push_back(std::move(r));
  return *this;
}

RankPlan& RankPlan::set_default(std::optional<Placement> placement) {
  default_ = std::move(placement);
  return *this;
}

std::optional<Placement> RankPlan::placement_of(std::string_view name) const {
  for (const auto& r : rules_)
    if (r->matches(name)) return r->placement;
  return default_;
}

namespace {

Placement placement_of_json(const nlohmann::ordered_json& v, const std::string& file,
                            const std::string& key) {
  try {
    if (v.is_string()) return Placement::parse(v.get<std::string>());
    if (v.is_object() && v.contains("begin") && v.contains("end"))
      return Placement::box(v.at("begin").get<std::vector<int64_t>>(),
                            v.at("end").get<std::vector<int64_t>>());
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, std::string("a bad box: ") + e.what(), file, key);
  } catch (Error& e) {
    throw e.with_source(file).with_record(key);
  }
  throw Error(ErrorCode::kInvalidArgument,
              "a placement is \"replicate\", \"shard:DIM\" or {\"begin\": [...], \"end\": [...]}, "
              "not " +
                  v.dump(),
              file, key);
}

}  // namespace

RankPlan RankPlan::from_json(std::string_view text, const std::string& name) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw Error(ErrorCode::kInvalidArgument, "a plan is a JSON object of pattern -> placement",
                name);
  RankPlan plan;
  const nlohmann::ordered_json* rules = &j;
  if (j.contains("tensors") && j.at("tensors").is_object()) {
    rules = &j.at("tensors");
    if (j.contains("default"))
      plan.set_default(j.at("default").is_null()
                           ? std::nullopt
                           : std::optional(placement_of_json(j.at("default"), name, "default")));
  }
  for (const auto& [key, value] : rules->items()) {
    Placement p = placement_of_json(value, name, key);
    try {
      if (key.starts_with("re:"))
        plan.add(key.substr(3), std::move(p), Match::kRegex);
      else
        plan.add(key, std::move(p), Match::kGlob);
    } catch (Error& e) {
      throw e.with_source(name).with_record(key);
    }
  }
  return plan;
}

}  // namespace ckpt
