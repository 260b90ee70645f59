#pragma once
// An enum's names, written once: a constexpr table of {value, name} per enum, and two helpers
// that read it both ways. Every name/parse pair (map modes, normalisation, head fusion, masks...)
// is one table:
//   constexpr EnumName<HeadFusion> kHeadFusionNames[] = {{HeadFusion::Mean, "mean"}, ...};
//   enum_name(kHeadFusionNames, fusion)            -> "mean" ("?" for a value the table lacks)
//   parse_enum(kHeadFusionNames, "max", fusion)     -> true, fusion = HeadFusion::Max
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace vitlens {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

template <typename E, size_t N>
constexpr const char* enum_name(const EnumName<E> (&table)[N], E value) {
  for (const EnumName<E>& row : table)
    if (row.value == value) return row.name;
  return "?";
}

// False (and `out` unchanged) when `name` is none of the table's names.
template <typename E, size_t N>
bool parse_enum(const EnumName<E> (&table)[N], std::string_view name, E& out) {
  for (const EnumName<E>& row : table)
    if (name == row.name) {
      out = row.value;
      return true;
    }
  return false;
}

// Every name, in the table's order (for a flag's choices and for messages).
template <typename E, size_t N>
std::vector<std::string> enum_names(const EnumName<E> (&table)[N]) {
  std::vector<std::string> names;
  for (const EnumName<E>& row : table) names.emplace_back(row.name);
  return names;
}

}  // namespace vitlens
