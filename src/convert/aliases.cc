// Tied weights to safetensors (transform.h, drop_aliases): names that are one tensor are written
// once, the others recorded in __metadata__, as safetensors' save_model does.

#include <algorithm>
#include <map>

#include "convert/transform.h"

namespace ckpt::internal {

void drop_aliases(const Checkpoint& c, FlatStateDict& flat, ConvertReport& r) {
  const auto& infos = c.tensors();
  // Groups of entries that share bytes, by their first entry.
  std::map<size_t, std::vector<size_t>> groups;
  for (size_t i = 0; i < flat.entries.size(); ++i)
    if (flat.entries[i].shares_with) groups[*flat.entries[i].shares_with].push_back(i);
  std::vector<bool> gone(flat.entries.size());
  for (auto& [first, members] : groups) {
    members.insert(members.begin(), first);
    const TensorInfo& a = infos[flat.entries[first].tensor];
    // Only names that are all of one storage, as one view, are one tensor: anything else (a
    // view of part of it) is left to be refused.
    auto whole = [&](size_t i) {
      const TensorInfo& t = infos[flat.entries[i].tensor];
      return t.storage == a.storage && t.dtype == a.dtype && t.shape == a.shape &&
             t.is_contiguous() && t.byte_offset() == 0 &&
             t.nbytes() == c.storages().at(t.storage).nbytes;
    };
    if (!std::all_of(members.begin(), members.end(), whole)) continue;
    // The name kept: the first in sorted order (safetensors' _remove_duplicate_names).
    size_t keep = members[0];
    for (size_t i : members)
      if (flat.entries[i].name < flat.entries[keep].name) keep = i;
    for (size_t i : members)
      if (i != keep) {
        gone[i] = true;
        r.aliases_dropped.emplace_back(flat.entries[i].name, flat.entries[keep].name);
      }
  }
  if (r.aliases_dropped.empty()) return;
  std::vector<size_t> new_index(flat.entries.size(), SIZE_MAX);
  std::vector<StateDictEntry> kept;
  for (size_t i = 0; i < flat.entries.size(); ++i) {
    if (gone[i]) continue;
    new_index[i] = kept.size();
    kept.push_back(flat.entries[i]);
  }
  for (auto& e : kept) {
    // An entry whose first name was left out is now the tensor's only name.
    if (e.alias_of)
      e.alias_of =
          new_index[*e.alias_of] == SIZE_MAX ? std::nullopt : std::optional(new_index[*e.alias_of]);
    if (e.shares_with)
      e.shares_with = new_index[*e.shares_with] == SIZE_MAX
                          ? std::nullopt
                          : std::optional(new_index[*e.shares_with]);
  }
  flat.entries = std::move(kept);
}

void finish_flat_content(const TransformRecipe& recipe, const Writer& w, const std::string& in,
                         WriteContent& content, ConvertReport& r) {
  if (!recipe.rename.empty())  // the names the file has
    for (auto& [gone, kept] : r.aliases_dropped) {
      gone = renamed(recipe, gone);
      kept = renamed(recipe, kept);
    }
  if (w.caps().metadata)
    for (const auto& [gone, kept] : r.aliases_dropped)
      content.metadata.emplace(gone, kept);  // an input's own key is kept, as save_model does
  if (!recipe.empty()) apply_transforms(recipe, w, in, content, r);
}

}  // namespace ckpt::internal
