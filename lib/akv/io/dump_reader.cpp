#include <cmath>
#include <filesystem>

#include "akv/core/errors.h"
#include "akv/io/dump.h"
#include "akv/tensor/half.h"

namespace akv {
DumpReader::DumpReader(std::string path) : path_(std::move(path)) {
  file_ = h5::open_read(path_);
  std::error_code ec;
  file_bytes_ = std::filesystem::file_size(path_, ec);
  read_meta();
  layers_.resize(meta_.n_layers);
  for (std::size_t l = 0; l < meta_.n_layers; ++l) read_layer_info(l);
  read_optional_vectors();
}

void DumpReader::read_meta() {
  hid_t root = file_.get();
  const std::string& f = path_;
  std::string format = h5::read_attr_string(root, "format", f, "format");
  if (format != kDumpFormat) {
    throw InvalidInput(std::string("not an akv dump (expected format \"") + kDumpFormat + "\")",
                       {f, "format", format});
  }
  std::int64_t version = h5::read_attr_int(root, "version", f, "version");
  if (version != kDumpVersion) {
    throw InvalidInput("unsupported akv-dump version (this akv reads version 1)",
                       {f, "version", std::to_string(version)});
  }
  read_shape_attrs(root, f, meta_);
}

void DumpReader::read_layer_info(std::size_t l) {
  const std::string& f = path_;
  const std::string group = "/layers/" + std::to_string(l);
  if (!h5::link_exists(file_.get(), group)) throw InvalidInput("missing layer group", {f, group});
  DumpLayerInfo& info = layers_[l];

  auto check = [&](DumpField field, DumpDatasetInfo& out, std::size_t d0, const char* d0_name,
                   const char* d0_meta, std::size_t d1, const char* d1_name) {
    const std::string path = dump_dataset_path(l, field);
    h5::Dataset d = h5::open_dataset(file_.get(), path, f);
    auto shape = h5::dataset_shape(d.get());
    const std::string where_shape = path + ".shape";
    const std::string what = "layer " + std::to_string(l) + " " + dump_field_name(field);
    if (shape.size() != 3) {
      throw InvalidInput(what + " must have rank 3, found rank " + std::to_string(shape.size()),
                         {f, where_shape, h5::shape_string(shape)});
    }
    if (shape[0] != d0) {
      throw InvalidInput(what + " has " + std::to_string(shape[0]) + " " + d0_name + ", meta says " +
                             std::to_string(d0) + " (" + d0_meta + ")",
                         {f, where_shape, h5::shape_string(shape)});
    }
    if (d1 != 0 && shape[1] != d1) {
      throw InvalidInput(what + " has " + std::to_string(shape[1]) + " " + d1_name +
                             ", expected " + std::to_string(d1),
                         {f, where_shape, h5::shape_string(shape)});
    }
    if (shape[2] != meta_.head_dim) {
      throw InvalidInput(what + " has head_dim " + std::to_string(shape[2]) + ", meta says " +
                             std::to_string(meta_.head_dim),
                         {f, where_shape, h5::shape_string(shape)});
    }
    h5::Type t(H5Dget_type(d.get()));
    auto dtype = h5::classify_float(t.get());
    if (!dtype) {
      throw InvalidInput(what + " has an unsupported dtype (akv reads f16, bf16, f32, f64)",
                         {f, path + ".dtype", "class " + std::to_string(H5Tget_class(t.get())) +
                                                  ", " + std::to_string(H5Tget_size(t.get())) +
                                                  " bytes"});
    }
    out.present = true;
    out.dtype = *dtype;
    out.storage_bytes = h5::storage_bytes(d.get());
    return shape[1];
  };

  check(DumpField::key, info.key, meta_.n_kv_heads, "kv heads", "n_kv_heads", meta_.n_tokens,
        "tokens");
  check(DumpField::value, info.value, meta_.n_kv_heads, "kv heads", "n_kv_heads",
        meta_.n_tokens, "tokens");
  std::size_t n_query = check(DumpField::query, info.query, meta_.n_heads, "heads", "n_heads",
                              l == 0 ? 0 : meta_.n_query, "query positions (as layer 0)");
  if (l == 0) {
    if (n_query == 0 || n_query > meta_.n_tokens) {
      throw InvalidInput("query positions must be between 1 and n_tokens (" +
                             std::to_string(meta_.n_tokens) + ")",
                         {f, dump_dataset_path(0, DumpField::query) + ".shape[1]",
                          std::to_string(n_query)});
    }
    meta_.n_query = n_query;
  }
  if (h5::link_exists(file_.get(), dump_dataset_path(l, DumpField::key_pre_rope))) {
    check(DumpField::key_pre_rope, info.key_pre_rope, meta_.n_kv_heads, "kv heads", "n_kv_heads",
          meta_.n_tokens, "tokens");
  }
  const std::string kinds_path = group + "/head_kind";
  if (h5::link_exists(file_.get(), kinds_path)) {
    info.head_kinds = h5::read_string_vector(file_.get(), kinds_path, f);
    if (info.head_kinds.size() != meta_.n_kv_heads) {
      throw InvalidInput("head_kind must name every kv head (" +
                             std::to_string(meta_.n_kv_heads) + ")",
                         {f, kinds_path + ".shape", "[" + std::to_string(info.head_kinds.size()) +
                                                        "]"});
    }
  }
}

void DumpReader::read_optional_vectors() {
  auto to_int32 = [&](const std::string& path, std::int64_t lo, std::int64_t hi,
                      const char* what) {
    auto v = h5::read_int_vector(file_.get(), path, path_);
    std::vector<std::int32_t> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (v[i] < lo || v[i] >= hi) {
        throw InvalidInput(std::string(what) + " out of range [" + std::to_string(lo) + ", " +
                               std::to_string(hi) + ")",
                           {path_, path + "[" + std::to_string(i) + "]", std::to_string(v[i])});
      }
      out[i] = static_cast<std::int32_t>(v[i]);
    }
    return out;
  };
  if (h5::link_exists(file_.get(), "/tokens")) {
    auto t = to_int32("/tokens", 0, INT32_MAX, "token id");
    if (t.size() != meta_.n_tokens) {
      throw InvalidInput("/tokens length differs from n_tokens (" +
                             std::to_string(meta_.n_tokens) + ")",
                         {path_, "/tokens.shape", "[" + std::to_string(t.size()) + "]"});
    }
    tokens_ = std::move(t);
  }
  if (h5::link_exists(file_.get(), "/needles")) {
    needles_ = to_int32("/needles", 0, static_cast<std::int64_t>(meta_.n_tokens),
                        "needle position");
  }
}

bool DumpReader::has_key_pre_rope() const {
  for (const auto& l : layers_) {
    if (!l.key_pre_rope.present) return false;
  }
  return !layers_.empty();
}

Tensor3 DumpReader::read(std::size_t layer, DumpField f, std::size_t head_begin,
                         std::size_t head_count) const {
  if (layer >= meta_.n_layers) {
    throw InvalidInput("layer out of range", {path_, "layer", std::to_string(layer)});
  }
  const DumpDatasetInfo& info = layers_[layer].field(f);
  const std::string path = dump_dataset_path(layer, f);
  if (!info.present) throw InvalidInput("missing dataset", {path_, path});
  const std::size_t heads = f == DumpField::query ? meta_.n_heads : meta_.n_kv_heads;
  const std::size_t rows = f == DumpField::query ? meta_.n_query : meta_.n_tokens;
  if (head_count == 0) head_count = heads - std::min(head_begin, heads);
  if (head_begin + head_count > heads || head_count == 0) {
    throw InvalidInput("head range out of bounds", {path_, path, std::to_string(head_begin) +
                                                                     "+" +
                                                                     std::to_string(head_count)});
  }
  const std::size_t d = meta_.head_dim;
  Tensor3 out(head_count, rows, d);

  h5::Dataset ds = h5::open_dataset(file_.get(), path, path_);
  h5::Space fspace(H5Dget_space(ds.get()));
  hsize_t start[3] = {head_begin, 0, 0};
  hsize_t count[3] = {head_count, rows, d};
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
  h5::Space mspace(H5Screate_simple(3, count, nullptr));
  herr_t rc;
  if (info.dtype == h5::DiskFloat::f16 || info.dtype == h5::DiskFloat::bf16) {
    std::vector<std::uint16_t> raw(out.size());
    h5::Type t = info.dtype == h5::DiskFloat::f16 ? h5::make_f16_type() : h5::make_bf16_type();
    rc = H5Dread(ds.get(), t.get(), mspace.get(), fspace.get(), H5P_DEFAULT, raw.data());
    if (rc >= 0) {
      if (info.dtype == h5::DiskFloat::f16) {
        f16_to_f32(raw.data(), out.data(), raw.size());
      } else {
        bf16_to_f32(raw.data(), out.data(), raw.size());
      }
    }
  } else {
    rc = H5Dread(ds.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, out.data());
  }
  if (rc < 0) throw CorruptData("cannot read dataset (truncated or damaged)", {path_, path});

  const float* p = out.data();
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(p[i])) {
      std::size_t h = i / (rows * d), r = (i / d) % rows, c = i % d;
      std::string row_name = f == DumpField::query
                                 ? "query " + std::to_string(r) + " (position " +
                                       std::to_string(meta_.first_query_pos() + r) + ")"
                                 : "token " + std::to_string(r);
      throw InvalidInput("non-finite value in layer " + std::to_string(layer) + " head " +
                             std::to_string(head_begin + h) + " " + row_name,
                         {path_, path + "[" + std::to_string(head_begin + h) + ", " +
                                     std::to_string(r) + ", " + std::to_string(c) + "]",
                          format_number(p[i])});
    }
  }
  return out;
}

}  // namespace akv
