#include <algorithm>

#include "akv/core/atomic_file.h"
#include "akv/core/errors.h"
#include "akv/io/dump.h"
#include "akv/tensor/half.h"

namespace akv {

struct DumpWriter::Impl {
  DumpMeta meta;
  DumpWriteOptions options;
  AtomicOutput out;
  h5::File file;
  h5::Type disk_type;  // f16 / bf16 custom type; invalid for f32
  // Heads written per (layer, field), to refuse commit() of an incomplete dump.
  std::vector<std::vector<std::size_t>> written;  // [n_layers][4]

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
      dm.n_heads % dm.n_kv_heads != 0 || dm.head_dim % 2 != 0) {
    throw InvalidInput("inconsistent dump shape", {m.out.path(), "meta", ""});
  }
  if (options.gzip < 0 || options.gzip > 9) {
    throw UsageError("gzip level must be 0..9", {"", "--gzip", std::to_string(options.gzip)});
  }
  m.file = h5::create(m.out.temp_path());
  if (options.dtype == DType::f16) m.disk_type = h5::make_f16_type();
  if (options.dtype == DType::bf16) m.disk_type = h5::make_bf16_type();
  hid_t root = m.file.get();
  h5::write_attr_string(root, "format", kDumpFormat);
  h5::write_attr_int(root, "version", kDumpVersion);
  write_shape_attrs(root, dm);
  m.written.assign(dm.n_layers, std::vector<std::size_t>(4, 0));
  for (std::size_t l = 0; l < dm.n_layers; ++l) {
    h5::create_group(root, "/layers/" + std::to_string(l));
    for (DumpField f : m.fields()) m.create_dataset(l, f);
  }
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
  }
  if (H5Fflush(m.file.get(), H5F_SCOPE_GLOBAL) < 0) {
    throw IoError("cannot flush HDF5 file (disk full?)", {m.out.path()});
  }
  m.file.reset();
  m.out.commit();
}

}  // namespace akv
