#include "akv/io/dump.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "akv/core/atomic_file.h"
#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/tensor/half.h"

namespace akv {

// ---- Shape attributes shared by dumps and caches.

namespace {

// A positive integer attribute of the root group.
std::size_t positive_attr(hid_t root, const std::string& name, const std::string& file) {
  std::int64_t v = h5::read_attr_int(root, name, file, name);
  if (v <= 0) throw InvalidInput("attribute must be positive", {file, name, std::to_string(v)});
  return static_cast<std::size_t>(v);
}

// The dataset's name in a layer's group: "o_proj", "attn_input", "kvzip_plus".
std::string dump_matrix_name(DumpMatrix m) {
  switch (m) {
    case DumpMatrix::out_proj: return "o_proj";
    case DumpMatrix::attn_input: return "attn_input";
    case DumpMatrix::kvzip_plus: return "kvzip_plus";
  }
  return "?";
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
  if (h5::attr_exists(root, "rope_variant")) m.rope_variant = h5::read_attr_string(root, "rope_variant", f, "rope_variant");
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
  if (!dm.rope_variant.empty()) h5::write_attr_string(root, "rope_variant", dm.rope_variant);
  h5::write_attr_int(root, "n_tokens", static_cast<std::int64_t>(dm.n_tokens));
}


void require_windows_hold_tokens(const DumpMeta& m, const std::string& file, const std::string& what) {
  for (std::size_t l = 0; l < m.n_layers; ++l) {
    const std::size_t w = m.window_of(l);
    if (w && w < m.n_tokens) {
      throw InvalidInput(what + " over a sliding-window layer shorter than the dump is not implemented (layer " +
                             std::to_string(l) + " attends within " + std::to_string(w) + " of the " +
                             std::to_string(m.n_tokens) + " tokens; a dump of at most " + std::to_string(m.smallest_window()) +
                             " tokens reads as global layers, akv evaluate --model runs the methods on the model)",
                         {file, "/layers/" + std::to_string(l) + ".sliding_window", std::to_string(w)});
    }
  }
}

std::string dump_field_name(DumpField f) {
  switch (f) {
    case DumpField::key: return "key";
    case DumpField::value: return "value";
    case DumpField::query: return "query";
    case DumpField::key_pre_rope: return "key_pre_rope";
    case DumpField::key_fisher: return "key_fisher";
    case DumpField::value_fisher: return "value_fisher";
  }
  return "?";
}

std::string dump_dataset_path(std::size_t layer, DumpField f) {
  return "/layers/" + std::to_string(layer) + "/" + dump_field_name(f);
}

std::string dump_matrix_path(std::size_t layer, DumpMatrix m) {
  return "/layers/" + std::to_string(layer) + "/" + dump_matrix_name(m);
}

DumpDatasetInfo& DumpLayerInfo::matrix(DumpMatrix m) {
  return m == DumpMatrix::out_proj ? out_proj : m == DumpMatrix::attn_input ? attn_input : kvzip_plus;
}
const DumpDatasetInfo& DumpLayerInfo::matrix(DumpMatrix m) const { return const_cast<DumpLayerInfo*>(this)->matrix(m); }

const DumpDatasetInfo& DumpLayerInfo::field(DumpField f) const {
  switch (f) {
    case DumpField::key: return key;
    case DumpField::value: return value;
    case DumpField::query: return query;
    case DumpField::key_pre_rope: return key_pre_rope;
    case DumpField::key_fisher: return key_fisher;
    case DumpField::value_fisher: return value_fisher;
  }
  return key;
}

// ---- Reader.

DumpReader::DumpReader(std::string path) : path_(std::move(path)) {
  file_ = h5::open_read(path_);
  std::error_code ec;
  file_bytes_ = std::filesystem::file_size(path_, ec);
  read_meta();
  // Layers are added as their groups validate: a declared n_layers allocates nothing by itself.
  for (std::size_t l = 0; l < meta_.n_layers; ++l) read_layer_info(l);
  if (!meta_.layer_window.empty()) meta_.layer_window.resize(meta_.n_layers, 0);
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

std::size_t DumpReader::check_tensor(std::size_t l, DumpField field, DumpDatasetInfo& out, std::size_t d0,
                                     const char* d0_name, const char* d0_meta, std::size_t d1, const char* d1_name) const {
  const std::string& f = path_;
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
  h5::check_stored(d.get(), f, path);
  out.present = true;
  out.dtype = *dtype;
  out.storage_bytes = h5::storage_bytes(d.get());
  return shape[1];
}

void DumpReader::check_matrix(std::size_t l, DumpMatrix which, DumpLayerInfo& info, std::size_t rows, std::size_t cols,
                              const std::string& expect) const {
  const std::string& f = path_;
  const std::string path = dump_matrix_path(l, which);
  DumpDatasetInfo& out = info.matrix(which);
  if (h5::link_exists(file_.get(), path)) {
    h5::Dataset d = h5::open_dataset(file_.get(), path, f);
    const auto shape = h5::dataset_shape(d.get());
    const std::size_t r0 = l > 0 ? layers_[0].matrix_rows[static_cast<std::size_t>(which)] : 0;
    const std::size_t c0 = l > 0 ? layers_[0].matrix_cols[static_cast<std::size_t>(which)] : 0;
    if (shape.size() != 2 || shape[0] == 0 || shape[1] == 0 || (rows && shape[0] != rows) || (cols && shape[1] != cols) ||
        (r0 && shape[0] != r0) || (c0 && shape[1] != c0)) {
      throw InvalidInput(dump_matrix_name(which) + " must be " + expect + (l > 0 ? ", as in layer 0" : ""),
                         {f, path + ".shape", h5::shape_string(shape)});
    }
    h5::Type t(H5Dget_type(d.get()));
    const auto dtype = h5::classify_float(t.get());
    if (!dtype) {
      throw InvalidInput(dump_matrix_name(which) + " has an unsupported dtype (akv reads f16, bf16, f32, f64)",
                         {f, path + ".dtype", std::to_string(H5Tget_size(t.get())) + " bytes"});
    }
    h5::check_stored(d.get(), f, path);
    out = {true, *dtype, h5::storage_bytes(d.get())};
    info.matrix_rows[static_cast<std::size_t>(which)] = shape[0];
    info.matrix_cols[static_cast<std::size_t>(which)] = shape[1];
  }
  if (l > 0 && out.present != layers_[0].matrix(which).present) {
    throw InvalidInput(dump_matrix_name(which) + " must be in every layer or in none",
                       {f, path, out.present ? "present" : "missing"});
  }
}

void DumpReader::read_layer_info(std::size_t l) {
  const std::string& f = path_;
  const std::string group = "/layers/" + std::to_string(l);
  if (!h5::link_exists(file_.get(), group)) throw InvalidInput("missing layer group", {f, group});
  DumpLayerInfo& info = layers_.emplace_back();
  {
    const h5::Group g(H5Gopen2(file_.get(), group.c_str(), H5P_DEFAULT));
    if (!g.valid()) throw CorruptData("cannot open the layer group", {f, group});
    if (h5::attr_exists(g.get(), "sliding_window")) {
      const std::string field = group + ".sliding_window";
      const std::int64_t w = h5::read_attr_int(g.get(), "sliding_window", f, field);
      if (w <= 0) throw InvalidInput("a layer's sliding window must be positive (absent: a global layer)", {f, field, std::to_string(w)});
      meta_.layer_window.resize(l + 1, 0);
      meta_.layer_window[l] = static_cast<std::size_t>(w);
    }
  }
  check_tensor(l, DumpField::key, info.key, meta_.n_kv_heads, "kv heads", "n_kv_heads", meta_.n_tokens, "tokens");
  check_tensor(l, DumpField::value, info.value, meta_.n_kv_heads, "kv heads", "n_kv_heads", meta_.n_tokens, "tokens");
  std::size_t n_query = check_tensor(l, DumpField::query, info.query, meta_.n_heads, "heads", "n_heads",
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
  for (const auto& [field, info_of] : {std::pair{DumpField::key_pre_rope, &info.key_pre_rope},
                                       std::pair{DumpField::key_fisher, &info.key_fisher},
                                       std::pair{DumpField::value_fisher, &info.value_fisher}}) {
    if (h5::link_exists(file_.get(), dump_dataset_path(l, field))) {
      check_tensor(l, field, *info_of, meta_.n_kv_heads, "kv heads", "n_kv_heads", meta_.n_tokens, "tokens");
    }
  }
  const std::string n_tokens = std::to_string(meta_.n_tokens), nh = std::to_string(meta_.n_heads * meta_.head_dim);
  check_matrix(l, DumpMatrix::out_proj, info, 0, meta_.n_heads * meta_.head_dim, "[hidden, n_heads * head_dim = " + nh + "]");
  check_matrix(l, DumpMatrix::attn_input, info, meta_.n_tokens, 0, "[n_tokens = " + n_tokens + ", hidden]");
  check_matrix(l, DumpMatrix::kvzip_plus, info, meta_.n_kv_heads, meta_.n_tokens,
               "[n_kv_heads = " + std::to_string(meta_.n_kv_heads) + ", n_tokens = " + n_tokens + "]");
  info.hidden = info.matrix_rows[static_cast<std::size_t>(DumpMatrix::out_proj)];
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

bool DumpReader::has_fisher() const {
  for (const auto& l : layers_) {
    if (!l.key_fisher.present || !l.value_fisher.present) return false;
  }
  return !layers_.empty();
}

bool DumpReader::has_out_proj() const { return !layers_.empty() && layers_[0].out_proj.present; }

RowMatrix DumpReader::read_out_proj(std::size_t layer) const { return read_matrix(layer, DumpMatrix::out_proj); }

bool DumpReader::has_matrix(DumpMatrix m) const { return !layers_.empty() && layers_[0].matrix(m).present; }

std::size_t DumpReader::input_dim() const {
  return layers_.empty() ? 0 : layers_[0].matrix_cols[static_cast<std::size_t>(DumpMatrix::attn_input)];
}

RowMatrix DumpReader::read_matrix(std::size_t layer, DumpMatrix which) const {
  const std::string path = dump_matrix_path(layer, which);
  if (layer >= meta_.n_layers || !layers_[layer].matrix(which).present) throw InvalidInput("missing dataset", {path_, path});
  const DumpDatasetInfo& info = layers_[layer].matrix(which);
  const std::size_t rows = layers_[layer].matrix_rows[static_cast<std::size_t>(which)];
  const std::size_t cols = layers_[layer].matrix_cols[static_cast<std::size_t>(which)];
  RowMatrix out(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
  h5::Dataset ds = h5::open_dataset(file_.get(), path, path_);
  herr_t rc = 0;
  if (info.dtype == h5::DiskFloat::f16 || info.dtype == h5::DiskFloat::bf16) {
    std::vector<std::uint16_t> raw(rows * cols);
    h5::Type t = info.dtype == h5::DiskFloat::f16 ? h5::make_f16_type() : h5::make_bf16_type();
    rc = H5Dread(ds.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data());
    if (rc >= 0 && info.dtype == h5::DiskFloat::f16) f16_to_f32(raw.data(), out.data(), raw.size());
    if (rc >= 0 && info.dtype == h5::DiskFloat::bf16) bf16_to_f32(raw.data(), out.data(), raw.size());
  } else {
    rc = H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
  }
  if (rc < 0) throw CorruptData("cannot read dataset (truncated or damaged)", {path_, path});
  const float* p = out.data();
  if (const std::size_t i = first_nonfinite(p, rows * cols); i < rows * cols) {
    throw InvalidInput("non-finite value in layer " + std::to_string(layer) + " " + dump_matrix_name(which),
                       {path_, path + "[" + std::to_string(i / cols) + ", " + std::to_string(i % cols) + "]",
                        format_number(p[i])});
  }
  return out;
}

Tensor3 DumpReader::read(std::size_t layer, DumpField f, std::size_t head_begin,
                         std::size_t head_count) const {
  Tensor3 out;
  read_into(out, layer, f, head_begin, head_count);
  return out;
}

void DumpReader::read_into(Tensor3& out, std::size_t layer, DumpField f, std::size_t head_begin,
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
  out.reshape(head_count, rows, d);

  h5::Dataset ds = h5::open_dataset(file_.get(), path, path_);
  h5::Space fspace(H5Dget_space(ds.get()));
  herr_t rc = 0;
  if (info.dtype == h5::DiskFloat::f16 || info.dtype == h5::DiskFloat::bf16) {
    // A head at a time through one reused buffer of stored values: no layer-sized temporary.
    raw_.resize(rows * d);
    h5::Type t = info.dtype == h5::DiskFloat::f16 ? h5::make_f16_type() : h5::make_bf16_type();
    hsize_t count[3] = {1, rows, d};
    h5::Space mspace(H5Screate_simple(3, count, nullptr));
    for (std::size_t h = 0; h < head_count && rc >= 0; ++h) {
      hsize_t start[3] = {head_begin + h, 0, 0};
      H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
      rc = H5Dread(ds.get(), t.get(), mspace.get(), fspace.get(), H5P_DEFAULT, raw_.data());
      if (rc < 0) break;
      if (info.dtype == h5::DiskFloat::f16) {
        f16_to_f32(raw_.data(), out.row(h, 0), raw_.size());
      } else {
        bf16_to_f32(raw_.data(), out.row(h, 0), raw_.size());
      }
    }
  } else {
    hsize_t start[3] = {head_begin, 0, 0};
    hsize_t count[3] = {head_count, rows, d};
    H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
    h5::Space mspace(H5Screate_simple(3, count, nullptr));
    rc = H5Dread(ds.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, out.data());
  }
  if (rc < 0) throw CorruptData("cannot read dataset (truncated or damaged)", {path_, path});

  const float* p = out.data();
  if (const std::size_t i = first_nonfinite(p, out.size()); i < out.size()) {
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

// ---- Writer.

struct DumpWriter::Impl {
  DumpMeta meta;
  DumpWriteOptions options;
  AtomicOutput out;
  h5::File file;
  h5::Type disk_type;  // f16 / bf16 custom type; invalid for f32
  // Heads written per (layer, field), to refuse commit() of an incomplete dump; then whether each
  // DumpMatrix was written.
  static constexpr std::size_t kMatrixSlot = 4;
  std::vector<std::vector<std::size_t>> written;  // [n_layers][kMatrixSlot + 3]

  Impl(std::string path, DumpMeta m, DumpWriteOptions o)
      : meta(std::move(m)), options(o), out(std::move(path)) {}

  std::vector<DumpField> fields() const {
    std::vector<DumpField> f = {DumpField::key, DumpField::value, DumpField::query};
    if (options.key_pre_rope) f.push_back(DumpField::key_pre_rope);
    return f;
  }
  std::size_t heads(DumpField f) const {
    return f == DumpField::query ? meta.n_heads : meta.n_kv_heads;
  }
  std::size_t rows(DumpField f) const {
    return f == DumpField::query ? meta.n_query : meta.n_tokens;
  }
  hid_t file_type() const {
    return options.dtype == DType::f32 ? H5T_IEEE_F32LE : disk_type.get();
  }
  void create_dataset(std::size_t layer, DumpField f);
  void write_matrix(std::size_t layer, DumpMatrix which, const RowMatrix& x, std::size_t rows, std::size_t cols,
                    bool as_f32);
};

void DumpWriter::Impl::create_dataset(std::size_t layer, DumpField f) {
  const std::size_t d = meta.head_dim;
  hsize_t dims[3] = {heads(f), rows(f), d};
  // One chunk holds part of one head (<= 1 MiB), so a head reads on its own.
  const std::size_t bytes_per_row = d * dtype_size(options.dtype);
  hsize_t chunk_rows = std::clamp<hsize_t>((1u << 20) / bytes_per_row, 1, rows(f));
  hsize_t chunk[3] = {1, chunk_rows, d};
  h5::PropList dcpl = h5::dataset_create_props();
  H5Pset_chunk(dcpl.get(), 3, chunk);
  if (options.gzip > 0) {
    H5Pset_shuffle(dcpl.get());
    H5Pset_deflate(dcpl.get(), static_cast<unsigned>(options.gzip));
  }
  h5::Space space(H5Screate_simple(3, dims, nullptr));
  const std::string path = dump_dataset_path(layer, f);
  h5::Dataset ds(H5Dcreate2(file.get(), path.c_str(), file_type(), space.get(), H5P_DEFAULT,
                            dcpl.get(), H5P_DEFAULT));
  if (!ds.valid()) throw IoError("cannot create dataset", {out.path(), path});
}

DumpWriter::DumpWriter(std::string path, DumpMeta meta, DumpWriteOptions options)
    : impl_(std::make_unique<Impl>(std::move(path), std::move(meta), options)) {
  Impl& m = *impl_;
  const DumpMeta& dm = m.meta;
  if (dm.n_layers == 0 || dm.n_heads == 0 || dm.n_kv_heads == 0 || dm.head_dim == 0 ||
      dm.n_tokens == 0 || dm.n_query == 0 || dm.n_query > dm.n_tokens ||
      dm.n_heads % dm.n_kv_heads != 0 || dm.head_dim % 2 != 0 ||
      (!dm.layer_window.empty() && dm.layer_window.size() != dm.n_layers)) {
    throw InvalidInput("inconsistent dump shape", {m.out.path(), "meta", ""});
  }
  if (options.gzip < 0 || options.gzip > 9) {
    throw InvalidInput("gzip level must be 0..9", {"", "--gzip", std::to_string(options.gzip)});
  }
  m.file = h5::create(m.out.temp_path(), m.out.path());
  if (options.dtype == DType::f16) m.disk_type = h5::make_f16_type();
  if (options.dtype == DType::bf16) m.disk_type = h5::make_bf16_type();
  hid_t root = m.file.get();
  h5::write_attr_string(root, "format", kDumpFormat);
  h5::write_attr_int(root, "version", kDumpVersion);
  write_shape_attrs(root, dm);
  m.written.assign(dm.n_layers, std::vector<std::size_t>(Impl::kMatrixSlot + 3, 0));
  for (std::size_t l = 0; l < dm.n_layers; ++l) {
    const h5::Group g = h5::create_group(root, "/layers/" + std::to_string(l));
    if (dm.window_of(l)) h5::write_attr_int(g.get(), "sliding_window", static_cast<std::int64_t>(dm.window_of(l)));
    for (DumpField f : m.fields()) m.create_dataset(l, f);
  }
}

void DumpWriter::Impl::write_matrix(std::size_t layer, DumpMatrix which, const RowMatrix& x, std::size_t rows,
                                    std::size_t cols, bool as_f32) {
  const std::string path = dump_matrix_path(layer, which);
  if (layer >= meta.n_layers || rows == 0 || static_cast<std::size_t>(x.rows()) != rows ||
      static_cast<std::size_t>(x.cols()) != cols) {
    throw InvalidInput(dump_matrix_name(which) + " does not fit the writer's shape",
                       {out.path(), path, "[" + std::to_string(x.rows()) + ", " + std::to_string(x.cols()) + "]"});
  }
  const std::vector<hsize_t> dims = {static_cast<hsize_t>(x.rows()), static_cast<hsize_t>(x.cols())};
  if (as_f32 || options.dtype == DType::f32) {
    h5::write_dataset(file.get(), path, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, dims, x.data());
  } else {
    std::vector<std::uint16_t> raw(static_cast<std::size_t>(x.size()));
    if (options.dtype == DType::f16) {
      f32_to_f16(x.data(), raw.data(), raw.size());
    } else {
      f32_to_bf16(x.data(), raw.data(), raw.size());
    }
    h5::write_dataset(file.get(), path, disk_type.get(), disk_type.get(), dims, raw.data());
  }
  written[layer][kMatrixSlot + static_cast<std::size_t>(which)] = 1;
}

void DumpWriter::write_out_proj(std::size_t layer, const RowMatrix& wo) {
  Impl& m = *impl_;
  m.write_matrix(layer, DumpMatrix::out_proj, wo, m.options.out_proj_hidden, m.meta.n_heads * m.meta.head_dim, false);
}

void DumpWriter::write_attn_input(std::size_t layer, const RowMatrix& x) {
  Impl& m = *impl_;
  m.write_matrix(layer, DumpMatrix::attn_input, x, m.options.input_dim ? m.meta.n_tokens : 0, m.options.input_dim, false);
}

void DumpWriter::write_kvzip_plus(std::size_t layer, const std::vector<std::vector<double>>& scores) {
  Impl& m = *impl_;
  const std::size_t H = m.meta.n_kv_heads, n = m.meta.n_tokens;
  if (scores.size() != H || std::any_of(scores.begin(), scores.end(), [n](const auto& r) { return r.size() != n; })) {
    throw InvalidInput("kvzip_plus does not fit the writer's shape",
                       {m.out.path(), dump_matrix_path(layer, DumpMatrix::kvzip_plus), std::to_string(scores.size()) + " heads"});
  }
  RowMatrix x(static_cast<Eigen::Index>(H), static_cast<Eigen::Index>(n));
  for (std::size_t h = 0; h < H; ++h) {
    for (std::size_t t = 0; t < n; ++t) x(static_cast<Eigen::Index>(h), static_cast<Eigen::Index>(t)) = static_cast<float>(scores[h][t]);
  }
  m.write_matrix(layer, DumpMatrix::kvzip_plus, x, m.options.kvzip_plus ? H : 0, n, true);
}

DumpWriter::~DumpWriter() = default;

void DumpWriter::write(std::size_t layer, DumpField f, std::size_t head_begin,
                       const Tensor3& block) {
  Impl& m = *impl_;
  const std::string path = dump_dataset_path(layer, f);
  if (layer >= m.meta.n_layers) throw InvalidInput("layer out of range", {m.out.path(), path});
  if (f == DumpField::key_pre_rope && !m.options.key_pre_rope) {
    throw InvalidInput("writer was not opened with key_pre_rope", {m.out.path(), path});
  }
  if (f == DumpField::key_fisher || f == DumpField::value_fisher) {
    throw InvalidInput("akv writes no sensitivity weights (users add them, e.g. with h5py)", {m.out.path(), path});
  }
  if (block.dim1() != m.rows(f) || block.dim2() != m.meta.head_dim ||
      head_begin + block.dim0() > m.heads(f)) {
    throw InvalidInput("block shape does not fit the dataset",
                       {m.out.path(), path, "[" + std::to_string(block.dim0()) + ", " +
                                                std::to_string(block.dim1()) + ", " +
                                                std::to_string(block.dim2()) + "] at head " +
                                                std::to_string(head_begin)});
  }
  h5::Dataset ds = h5::open_dataset(m.file.get(), path, m.out.path());
  h5::Space fspace(H5Dget_space(ds.get()));
  hsize_t start[3] = {head_begin, 0, 0};
  hsize_t count[3] = {block.dim0(), block.dim1(), block.dim2()};
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
  h5::Space mspace(H5Screate_simple(3, count, nullptr));
  herr_t rc;
  if (m.options.dtype == DType::f32) {
    rc = H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT,
                  block.data());
  } else {
    std::vector<std::uint16_t> raw(block.size());
    if (m.options.dtype == DType::f16) {
      f32_to_f16(block.data(), raw.data(), raw.size());
    } else {
      f32_to_bf16(block.data(), raw.data(), raw.size());
    }
    rc = H5Dwrite(ds.get(), m.disk_type.get(), mspace.get(), fspace.get(), H5P_DEFAULT,
                  raw.data());
  }
  if (rc < 0) throw IoError("cannot write dataset (disk full?)", {m.out.path(), path});
  m.written[layer][static_cast<std::size_t>(f)] += block.dim0();
}

void DumpWriter::write_head_kinds(std::size_t layer, const std::vector<std::string>& kinds) {
  Impl& m = *impl_;
  if (kinds.size() != m.meta.n_kv_heads) {
    throw InvalidInput("head_kind needs one entry per kv head", {m.out.path(), "head_kind"});
  }
  h5::write_string_vector(m.file.get(), "/layers/" + std::to_string(layer) + "/head_kind", kinds);
}

void DumpWriter::write_tokens(const std::vector<std::int32_t>& tokens) {
  Impl& m = *impl_;
  if (tokens.size() != m.meta.n_tokens) {
    throw InvalidInput("tokens length differs from n_tokens", {m.out.path(), "/tokens",
                                                               std::to_string(tokens.size())});
  }
  h5::write_int32_vector(m.file.get(), "/tokens", tokens);
}

void DumpWriter::write_needles(const std::vector<std::int32_t>& positions) {
  h5::write_int32_vector(impl_->file.get(), "/needles", positions);
}

void DumpWriter::write_root_attr(const std::string& name, const std::string& value) {
  h5::write_attr_string(impl_->file.get(), name, value);
}

void DumpWriter::write_root_attr(const std::string& name, std::int64_t value) {
  h5::write_attr_int(impl_->file.get(), name, value);
}

void DumpWriter::commit() {
  Impl& m = *impl_;
  for (std::size_t l = 0; l < m.meta.n_layers; ++l) {
    for (DumpField f : m.fields()) {
      if (m.written[l][static_cast<std::size_t>(f)] < m.heads(f)) {
        throw InvalidInput("dump is incomplete: not every head was written",
                           {m.out.path(), dump_dataset_path(l, f)});
      }
    }
    const std::pair<DumpMatrix, bool> asked[] = {{DumpMatrix::out_proj, m.options.out_proj_hidden > 0},
                                                 {DumpMatrix::attn_input, m.options.input_dim > 0},
                                                 {DumpMatrix::kvzip_plus, m.options.kvzip_plus}};
    for (const auto& [which, wanted] : asked) {
      if (wanted && m.written[l][Impl::kMatrixSlot + static_cast<std::size_t>(which)] == 0) {
        throw InvalidInput("dump is incomplete: " + dump_matrix_name(which) + " was not written",
                           {m.out.path(), dump_matrix_path(l, which)});
      }
    }
  }
  if (H5Fflush(m.file.get(), H5F_SCOPE_GLOBAL) < 0) {
    throw IoError("cannot flush HDF5 file (disk full?)", {m.out.path()});
  }
  m.file.reset();
  m.out.commit();
}

}  // namespace akv
