#include "akv/io/hdf5.h"

#include <filesystem>
#include <fstream>
#include <mutex>

#include "akv/core/checked.h"
#include "akv/core/errors.h"

namespace akv::h5 {

void silence_errors() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

File open_read(const std::string& path) {
  silence_errors();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw IoError("file not found", {path});
  if (std::filesystem::is_directory(path, ec)) throw IoError("is a directory, not a file", {path});
  {
    std::ifstream probe(path, std::ios::binary);
    if (!probe) throw IoError("cannot open file for reading", {path});
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) throw CorruptData("not an HDF5 file", {path});
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) throw CorruptData("cannot open HDF5 file (truncated or damaged)", {path});
  return File(id);
}

File create(const std::string& path, const std::string& shown) {
  silence_errors();
  PropList fcpl(H5Pcreate(H5P_FILE_CREATE));
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT);
  if (id < 0) throw IoError("cannot create HDF5 file", {shown.empty() ? path : shown});
  return File(id);
}

PropList dataset_create_props() {
  PropList p(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_obj_track_times(p.get(), false);
  return p;
}

Group create_group(hid_t loc, const std::string& path) {
  PropList lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  PropList gcpl(H5Pcreate(H5P_GROUP_CREATE));
  H5Pset_obj_track_times(gcpl.get(), false);
  Group g(H5Gcreate2(loc, path.c_str(), lcpl.get(), gcpl.get(), H5P_DEFAULT));
  if (!g.valid()) throw IoError("cannot create group", {"", path, ""});
  return g;
}

bool link_exists(hid_t loc, const std::string& path) {
  // Check each component so that a missing parent group is not an error.
  std::string partial;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t slash = path.find('/', start);
    std::string part = path.substr(start, slash == std::string::npos ? std::string::npos
                                                                     : slash - start);
    if (!part.empty()) {
      partial += (partial.empty() && path[0] != '/' ? "" : "/") + part;
      if (H5Lexists(loc, partial.c_str(), H5P_DEFAULT) <= 0) return false;
    }
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return true;
}

bool attr_exists(hid_t obj, const std::string& name) {
  return H5Aexists(obj, name.c_str()) > 0;
}

namespace {

Attribute open_attr(hid_t obj, const std::string& name, const std::string& file,
                    const std::string& field) {
  if (!attr_exists(obj, name)) throw InvalidInput("missing attribute", {file, field, ""});
  Attribute a(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
  if (!a.valid()) throw CorruptData("cannot open attribute", {file, field, ""});
  Space s(H5Aget_space(a.get()));
  hssize_t n = H5Sget_simple_extent_npoints(s.get());
  if (n != 1) {
    throw InvalidInput("attribute must be a scalar", {file, field, std::to_string(n) + " values"});
  }
  return a;
}

std::string class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_STRING: return "string";
    default: return "other";
  }
}

}  // namespace

std::string read_attr_string(hid_t obj, const std::string& name, const std::string& file,
                             const std::string& field) {
  Attribute a = open_attr(obj, name, file, field);
  Type t(H5Aget_type(a.get()));
  if (H5Tget_class(t.get()) != H5T_STRING) {
    throw InvalidInput("attribute must be a string", {file, field,
                                                      class_name(H5Tget_class(t.get()))});
  }
  if (H5Tis_variable_str(t.get()) > 0) {
    Type mem(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(t.get()));
    char* value = nullptr;
    if (H5Aread(a.get(), mem.get(), &value) < 0 || value == nullptr) {
      throw CorruptData("cannot read attribute", {file, field, ""});
    }
    std::string out(value);
    H5free_memory(value);
    return out;
  }
  std::size_t size = H5Tget_size(t.get());
  std::string buf(size, '\0');
  Type mem(H5Tcopy(t.get()));
  if (H5Aread(a.get(), mem.get(), buf.data()) < 0) {
    throw CorruptData("cannot read attribute", {file, field, ""});
  }
  buf.resize(buf.find('\0') == std::string::npos ? buf.size() : buf.find('\0'));
  while (!buf.empty() && buf.back() == ' ') buf.pop_back();
  return buf;
}

std::int64_t read_attr_int(hid_t obj, const std::string& name, const std::string& file,
                           const std::string& field) {
  Attribute a = open_attr(obj, name, file, field);
  Type t(H5Aget_type(a.get()));
  if (H5Tget_class(t.get()) != H5T_INTEGER) {
    throw InvalidInput("attribute must be an integer", {file, field,
                                                        class_name(H5Tget_class(t.get()))});
  }
  std::int64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) {
    throw CorruptData("cannot read attribute", {file, field, ""});
  }
  return v;
}

double read_attr_double(hid_t obj, const std::string& name, const std::string& file,
                        const std::string& field) {
  Attribute a = open_attr(obj, name, file, field);
  Type t(H5Aget_type(a.get()));
  H5T_class_t c = H5Tget_class(t.get());
  if (c != H5T_FLOAT && c != H5T_INTEGER) {
    throw InvalidInput("attribute must be a number", {file, field, class_name(c)});
  }
  double v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) < 0) {
    throw CorruptData("cannot read attribute", {file, field, ""});
  }
  return v;
}

namespace {
void write_attr(hid_t obj, const std::string& name, hid_t type, const void* value) {
  if (attr_exists(obj, name)) H5Adelete(obj, name.c_str());
  Space s(H5Screate(H5S_SCALAR));
  Attribute a(H5Acreate2(obj, name.c_str(), type, s.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!a.valid() || H5Awrite(a.get(), type, value) < 0) {
    throw IoError("cannot write attribute", {"", name, ""});
  }
}
}  // namespace

void write_attr_string(hid_t obj, const std::string& name, const std::string& value) {
  Type t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  const char* p = value.c_str();
  write_attr(obj, name, t.get(), &p);
}

void write_attr_int(hid_t obj, const std::string& name, std::int64_t value) {
  write_attr(obj, name, H5T_STD_I64LE, &value);
}

void write_attr_double(hid_t obj, const std::string& name, double value) {
  write_attr(obj, name, H5T_IEEE_F64LE, &value);
}

Dataset open_dataset(hid_t loc, const std::string& path, const std::string& file) {
  if (!link_exists(loc, path)) throw InvalidInput("missing dataset", {file, path, ""});
  H5O_info_t info;
  if (H5Oget_info_by_name(loc, path.c_str(), &info, H5P_DEFAULT) < 0 ||
      info.type != H5O_TYPE_DATASET) {
    throw InvalidInput("expected a dataset", {file, path, ""});
  }
  Dataset d(H5Dopen2(loc, path.c_str(), H5P_DEFAULT));
  if (!d.valid()) throw CorruptData("cannot open dataset", {file, path, ""});
  return d;
}

std::vector<hsize_t> dataset_shape(hid_t dset) {
  Space s(H5Dget_space(dset));
  int rank = H5Sget_simple_extent_ndims(s.get());
  if (rank < 0) return {};
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(s.get(), dims.data(), nullptr);
  return dims;
}

std::uint64_t storage_bytes(hid_t dset) { return H5Dget_storage_size(dset); }

std::uint64_t check_stored(hid_t dset, const std::string& file, const std::string& path) {
  const std::vector<hsize_t> shape = dataset_shape(dset);
  const Where where{file, path + ".shape", shape_string(shape)};
  std::uint64_t n = 1;
  for (const hsize_t v : shape) n = checked_mul(n, v, where);
  Type t(H5Dget_type(dset));
  const std::uint64_t declared = checked_mul(n, H5Tget_size(t.get()), where);
  PropList dcpl(H5Dget_create_plist(dset));
  const bool filtered = dcpl.valid() && H5Pget_nfilters(dcpl.get()) > 0;
  constexpr std::uint64_t kMaxRatio = 1032;  // DEFLATE
  const std::uint64_t stored = storage_bytes(dset);
  const std::uint64_t limit =
      filtered ? (stored > UINT64_MAX / kMaxRatio ? UINT64_MAX : stored * kMaxRatio) : stored;
  if (declared > limit) {
    throw CorruptData("dataset stores fewer bytes than its shape declares (never written, or "
                      "truncated)",
                      {file, path, std::to_string(stored) + " bytes stored, " +
                                       std::to_string(declared) + " declared by " +
                                       shape_string(shape)});
  }
  return n;
}

std::string shape_string(const std::vector<hsize_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string disk_float_name(DiskFloat t) {
  switch (t) {
    case DiskFloat::f16: return "f16";
    case DiskFloat::bf16: return "bf16";
    case DiskFloat::f32: return "f32";
    case DiskFloat::f64: return "f64";
  }
  return "?";
}

std::optional<DiskFloat> classify_float(hid_t type) {
  if (H5Tget_class(type) != H5T_FLOAT) return std::nullopt;
  std::size_t size = H5Tget_size(type);
  if (size == 4) return DiskFloat::f32;
  if (size == 8) return DiskFloat::f64;
  if (size != 2 || H5Tget_order(type) != H5T_ORDER_LE) return std::nullopt;
  std::size_t spos, epos, esize, mpos, msize;
  if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0) return std::nullopt;
  if (spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 &&
      H5Tget_ebias(type) == 15) {
    return DiskFloat::f16;
  }
  if (spos == 15 && epos == 7 && esize == 8 && mpos == 0 && msize == 7 &&
      H5Tget_ebias(type) == 127) {
    return DiskFloat::bf16;
  }
  return std::nullopt;
}

namespace {
Type make_half_type(std::size_t epos, std::size_t esize, std::size_t msize, std::size_t ebias) {
  Type t(H5Tcopy(H5T_IEEE_F32LE));
  H5Tset_fields(t.get(), 15, epos, esize, 0, msize);
  H5Tset_precision(t.get(), 16);
  H5Tset_size(t.get(), 2);
  H5Tset_ebias(t.get(), ebias);
  return t;
}

// Opens a 1-D dataset whose elements are of class `cls`; returns its type and length.
Dataset open_vector(hid_t loc, const std::string& path, const std::string& file, H5T_class_t cls,
                    const char* what, Type& type, std::size_t& n) {
  Dataset d = open_dataset(loc, path, file);
  type = Type(H5Dget_type(d.get()));
  if (H5Tget_class(type.get()) != cls) {
    throw InvalidInput(std::string("dataset must hold ") + what,
                       {file, path, class_name(H5Tget_class(type.get()))});
  }
  auto shape = dataset_shape(d.get());
  if (shape.size() != 1) {
    throw InvalidInput("dataset must be 1-D", {file, path + ".shape", shape_string(shape)});
  }
  n = check_stored(d.get(), file, path);
  return d;
}
}  // namespace

Type make_f16_type() { return make_half_type(10, 5, 10, 15); }
Type make_bf16_type() { return make_half_type(7, 8, 7, 127); }

std::vector<std::int64_t> read_int_vector(hid_t loc, const std::string& path,
                                          const std::string& file) {
  Type t;
  std::size_t n = 0;
  Dataset d = open_vector(loc, path, file, H5T_INTEGER, "integers", t, n);
  std::vector<std::int64_t> v(n);
  if (!v.empty() && H5Dread(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                            v.data()) < 0) {
    throw CorruptData("cannot read dataset", {file, path, ""});
  }
  return v;
}

std::vector<std::string> read_string_vector(hid_t loc, const std::string& path,
                                            const std::string& file) {
  Type t;
  std::size_t n = 0;
  Dataset d = open_vector(loc, path, file, H5T_STRING, "strings", t, n);
  std::vector<std::string> out(n);
  if (n == 0) return out;
  if (H5Tis_variable_str(t.get()) > 0) {
    Type mem(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(t.get()));
    std::vector<char*> ptrs(n, nullptr);
    if (H5Dread(d.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) < 0) {
      throw CorruptData("cannot read dataset", {file, path, ""});
    }
    for (std::size_t i = 0; i < n; ++i) {
      out[i] = ptrs[i] ? ptrs[i] : "";
      H5free_memory(ptrs[i]);
    }
    return out;
  }
  std::size_t size = H5Tget_size(t.get());
  std::vector<char> buf(n * size);
  Type mem(H5Tcopy(t.get()));
  if (H5Dread(d.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0) {
    throw CorruptData("cannot read dataset", {file, path, ""});
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::string s(buf.data() + i * size, size);
    s.resize(s.find('\0') == std::string::npos ? s.size() : s.find('\0'));
    out[i] = s;
  }
  return out;
}

void write_string_vector(hid_t loc, const std::string& path,
                         const std::vector<std::string>& values) {
  Type t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  hsize_t n = values.size();
  Space s(H5Screate_simple(1, &n, nullptr));
  PropList dcpl = dataset_create_props();
  Dataset d(H5Dcreate2(loc, path.c_str(), t.get(), s.get(), H5P_DEFAULT, dcpl.get(),
                       H5P_DEFAULT));
  std::vector<const char*> ptrs;
  for (const auto& v : values) ptrs.push_back(v.c_str());
  if (!d.valid() || (n > 0 && H5Dwrite(d.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                       ptrs.data()) < 0)) {
    throw IoError("cannot write dataset", {"", path, ""});
  }
}

void write_dataset(hid_t loc, const std::string& path, hid_t file_type, hid_t mem_type,
                   const std::vector<hsize_t>& dims, const void* data) {
  Space s(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  PropList dcpl = dataset_create_props();
  Dataset d(H5Dcreate2(loc, path.c_str(), file_type, s.get(), H5P_DEFAULT, dcpl.get(),
                       H5P_DEFAULT));
  std::size_t n = 1;
  for (hsize_t v : dims) n *= v;
  if (!d.valid() ||
      (n > 0 && H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)) {
    throw IoError("cannot write dataset", {"", path, ""});
  }
}

std::uint64_t check_dataset(hid_t loc, const std::string& path, const std::vector<hsize_t>& dims,
                            const std::string& file) {
  Dataset d = open_dataset(loc, path, file);
  const std::vector<hsize_t> shape = dataset_shape(d.get());
  if (shape != dims) {
    throw CorruptData("dataset has the wrong shape (expected " + shape_string(dims) + ")",
                      {file, path, shape_string(shape)});
  }
  return check_stored(d.get(), file, path);
}

void read_dataset(hid_t loc, const std::string& path, hid_t mem_type,
                  const std::vector<hsize_t>& dims, void* data, const std::string& file) {
  const std::uint64_t n = check_dataset(loc, path, dims, file);
  Dataset d = open_dataset(loc, path, file);
  if (n > 0 && H5Dread(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    throw CorruptData("cannot read dataset", {file, path, ""});
  }
}

void write_int32_vector(hid_t loc, const std::string& path, const std::vector<std::int32_t>& v) {
  hsize_t n = v.size();
  Space s(H5Screate_simple(1, &n, nullptr));
  PropList dcpl = dataset_create_props();
  Dataset d(H5Dcreate2(loc, path.c_str(), H5T_STD_I32LE, s.get(), H5P_DEFAULT, dcpl.get(),
                       H5P_DEFAULT));
  if (!d.valid() || (n > 0 && H5Dwrite(d.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL,
                                       H5P_DEFAULT, v.data()) < 0)) {
    throw IoError("cannot write dataset", {"", path, ""});
  }
}

}  // namespace akv::h5
