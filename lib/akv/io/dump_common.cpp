#include "akv/io/dump.h"

namespace akv {

std::string dump_field_name(DumpField f) {
  switch (f) {
    case DumpField::key: return "key";
    case DumpField::value: return "value";
    case DumpField::query: return "query";
    case DumpField::key_pre_rope: return "key_pre_rope";
  }
  return "?";
}

std::string dump_dataset_path(std::size_t layer, DumpField f) {
  return "/layers/" + std::to_string(layer) + "/" + dump_field_name(f);
}

const DumpDatasetInfo& DumpLayerInfo::field(DumpField f) const {
  switch (f) {
    case DumpField::key: return key;
    case DumpField::value: return value;
    case DumpField::query: return query;
    case DumpField::key_pre_rope: return key_pre_rope;
  }
  return key;
}

}  // namespace akv
