#include "akv/io/dump.h"

#include <cmath>
#include <cstdio>

#include "akv/core/errors.h"

namespace akv {
namespace {

// A positive integer attribute of the root group.
std::size_t positive_attr(hid_t root, const std::string& name, const std::string& file) {
  std::int64_t v = h5::read_attr_int(root, name, file, name);
  if (v <= 0) throw InvalidInput("attribute must be positive", {file, name, std::to_string(v)});
  return static_cast<std::size_t>(v);
}

}  // namespace

void read_shape_attrs(hid_t root, const std::string& f, DumpMeta& m) {
  m.model = h5::read_attr_string(root, "model", f, "model");
  m.n_layers = positive_attr(root, "n_layers", f);
  m.n_heads = positive_attr(root, "n_heads", f);
  m.n_kv_heads = positive_attr(root, "n_kv_heads", f);
  m.head_dim = positive_attr(root, "head_dim", f);
  m.n_tokens = positive_attr(root, "n_tokens", f);
  m.rope_theta = h5::read_attr_double(root, "rope_theta", f, "rope_theta");
  std::string layout = h5::read_attr_string(root, "rope_layout", f, "rope_layout");
  try {
    m.rope_layout = parse_rope_layout(layout);
  } catch (const InvalidInput&) {
    throw InvalidInput("unknown RoPE layout (expected interleaved or rotate-half)",
                       {f, "rope_layout", layout});
  }
  if (m.n_heads % m.n_kv_heads != 0) {
    throw InvalidInput("n_heads must be a multiple of n_kv_heads (" +
                           std::to_string(m.n_kv_heads) + ")",
                       {f, "n_heads", std::to_string(m.n_heads)});
  }
  if (m.head_dim % 2 != 0) {
    throw InvalidInput("head_dim must be even (RoPE rotates pairs)",
                       {f, "head_dim", std::to_string(m.head_dim)});
  }
  if (!std::isfinite(m.rope_theta) || m.rope_theta <= 1.0) {
    throw InvalidInput("rope_theta must be finite and > 1", {f, "rope_theta",
                                                             format_number(m.rope_theta)});
  }
}

void write_shape_attrs(hid_t root, const DumpMeta& dm) {
  h5::write_attr_string(root, "model", dm.model);
  h5::write_attr_int(root, "n_layers", static_cast<std::int64_t>(dm.n_layers));
  h5::write_attr_int(root, "n_heads", static_cast<std::int64_t>(dm.n_heads));
  h5::write_attr_int(root, "n_kv_heads", static_cast<std::int64_t>(dm.n_kv_heads));
  h5::write_attr_int(root, "head_dim", static_cast<std::int64_t>(dm.head_dim));
  h5::write_attr_double(root, "rope_theta", dm.rope_theta);
  h5::write_attr_string(root, "rope_layout", rope_layout_name(dm.rope_layout));
  h5::write_attr_int(root, "n_tokens", static_cast<std::int64_t>(dm.n_tokens));
}


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
