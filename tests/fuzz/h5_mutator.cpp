#include "h5_mutator.h"

#include <hdf5.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <vector>

#include "fuzz_common.h"

namespace akv::fuzz {
namespace {

// AKV_FUZZ_TRACE=1 prints each edit on stderr (to read what a finding's input does).
bool tracing() {
  static const bool on = std::getenv("AKV_FUZZ_TRACE") != nullptr;
  return on;
}

void trace(const std::string& what) {
  if (tracing()) std::fprintf(stderr, "h5-edit: %s\n", what.c_str());
}

struct Target {
  std::string object;  // path of the object
  std::string attr;    // attribute name; empty for the object itself
  bool dataset = false;
};

herr_t collect_link(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(std::string("/") + name);
  return 0;
}

herr_t collect_attr(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

std::int64_t edge_int(FuzzedDataProvider& fdp) {
  static const std::int64_t kEdges[] = {0, 1, -1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 64, 127, 128, 255,
                                        256, 1024, 65535, 65536, INT32_MAX, INT32_MIN,
                                        std::int64_t{1} << 31, std::int64_t{1} << 32,
                                        std::int64_t{1} << 40, INT64_MAX, INT64_MIN};
  if (fdp.ConsumeBool()) return fdp.ConsumeIntegral<std::int64_t>();
  return fdp.PickValueInArray(kEdges);
}

double edge_real(FuzzedDataProvider& fdp) {
  static const double kEdges[] = {0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-30, 1e30, 65504.0, 65520.0,
                                  std::numeric_limits<double>::quiet_NaN(),
                                  std::numeric_limits<double>::infinity(),
                                  -std::numeric_limits<double>::infinity(),
                                  std::numeric_limits<double>::denorm_min(),
                                  std::numeric_limits<double>::max(), 10000.0, 1e-6};
  if (fdp.ConsumeBool()) return fdp.ConsumeFloatingPoint<double>();
  return fdp.PickValueInArray(kEdges);
}

hsize_t edge_dim(FuzzedDataProvider& fdp) {
  static const hsize_t kEdges[] = {0, 1, 2, 3, 4, 7, 8, 16, 17, 32, 33, 63, 64, 128,
                                   hsize_t{1} << 16, hsize_t{1} << 20, hsize_t{1} << 31,
                                   hsize_t{1} << 40};
  if (fdp.ConsumeBool()) return fdp.ConsumeIntegralInRange<hsize_t>(0, 300);
  return fdp.PickValueInArray(kEdges);
}

// A file type for a new attribute or dataset; the caller closes it.
hid_t pick_type(FuzzedDataProvider& fdp, hid_t original) {
  switch (fdp.ConsumeIntegralInRange(0, 8)) {
    case 0: return original >= 0 ? H5Tcopy(original) : H5Tcopy(H5T_IEEE_F32LE);
    case 1: {
      hid_t t = H5Tcopy(H5T_IEEE_F32LE);  // binary16, as h5py writes it
      H5Tset_fields(t, 15, 10, 5, 0, 10);
      H5Tset_size(t, 2);
      H5Tset_ebias(t, 15);
      return t;
    }
    case 2: return H5Tcopy(H5T_IEEE_F64LE);
    case 3: return H5Tcopy(H5T_STD_I8LE);
    case 4: return H5Tcopy(H5T_STD_U8LE);
    case 5: return H5Tcopy(H5T_STD_I32LE);
    case 6: return H5Tcopy(H5T_STD_U16LE);
    case 7: return H5Tcopy(H5T_STD_I64LE);
    default: {
      hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, fdp.ConsumeIntegralInRange<std::size_t>(1, 16));
      return t;
    }
  }
}

void set_scalar_attr(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type,
                     const void* value) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    H5Awrite(a, mem_type, value);
    H5Aclose(a);
  }
  H5Sclose(space);
}

void edit_attribute(hid_t file, const Target& t, FuzzedDataProvider& fdp) {
  hid_t obj = H5Oopen(file, t.object.c_str(), H5P_DEFAULT);
  if (obj < 0) return;
  const std::string name = t.object + "." + t.attr;
  switch (fdp.ConsumeIntegralInRange(0, 4)) {
    case 0: {
      const std::int64_t v = edge_int(fdp);
      trace(name + " = int " + std::to_string(v));
      set_scalar_attr(obj, t.attr, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
      break;
    }
    case 1: {
      const double v = edge_real(fdp);
      trace(name + " = real " + std::to_string(v));
      set_scalar_attr(obj, t.attr, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
      break;
    }
    case 2: {
      const std::string s = fdp.ConsumeRandomLengthString(80);
      trace(name + " = string '" + s + "'");
      const char* p = s.c_str();
      hid_t type = H5Tcopy(H5T_C_S1);
      H5Tset_size(type, H5T_VARIABLE);
      H5Tset_cset(type, H5T_CSET_UTF8);
      set_scalar_attr(obj, t.attr, type, type, &p);
      H5Tclose(type);
      break;
    }
    case 3: {  // a 1-D array where a scalar belongs
      const std::int64_t v[2] = {edge_int(fdp), edge_int(fdp)};
      trace(name + " = array [" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + "]");
      if (H5Aexists(obj, t.attr.c_str()) > 0) H5Adelete(obj, t.attr.c_str());
      const hsize_t dims[1] = {2};
      hid_t space = H5Screate_simple(1, dims, nullptr);
      hid_t a = H5Acreate2(obj, t.attr.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
      if (a >= 0) {
        H5Awrite(a, H5T_NATIVE_INT64, v);
        H5Aclose(a);
      }
      H5Sclose(space);
      break;
    }
    default:
      trace("delete " + name);
      H5Adelete(obj, t.attr.c_str());
  }
  H5Oclose(obj);
}

// Overwrites a few elements of a dataset, keeping its type and shape.
void poke_dataset(hid_t file, const std::string& path, FuzzedDataProvider& fdp) {
  hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
  if (d < 0) return;
  hid_t type = H5Dget_type(d);
  hid_t space = H5Dget_space(d);
  hssize_t n = H5Sget_simple_extent_npoints(space);
  const H5T_class_t cls = H5Tget_class(type);
  // A declared-only dataset (replaced by a huge shape, no data) stays unwritten: writing one
  // element would make HDF5 allocate all of it, fail, and leave the file unclosable.
  if (static_cast<long double>(H5Dget_storage_size(d)) <
      static_cast<long double>(n) * static_cast<long double>(H5Tget_size(type))) {
    n = 0;
  }
  const int pokes = fdp.ConsumeIntegralInRange(1, 4);
  for (int i = 0; i < pokes && n > 0 && cls != H5T_STRING; ++i) {
    const hsize_t rank = static_cast<hsize_t>(H5Sget_simple_extent_ndims(space));
    std::vector<hsize_t> dims(rank), coord(rank);
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    for (hsize_t r = 0; r < rank; ++r) coord[r] = fdp.ConsumeIntegralInRange<hsize_t>(0, dims[r] - 1);
    H5Sselect_elements(space, H5S_SELECT_SET, 1, coord.data());
    trace("poke one element of " + path);
    const hsize_t one = 1;
    hid_t mspace = H5Screate_simple(1, &one, nullptr);
    if (cls == H5T_FLOAT && fdp.ConsumeBool()) {
      const double v = edge_real(fdp);
      H5Dwrite(d, H5T_NATIVE_DOUBLE, mspace, space, H5P_DEFAULT, &v);
    } else if (cls == H5T_INTEGER && fdp.ConsumeBool()) {
      const std::int64_t v = edge_int(fdp);
      H5Dwrite(d, H5T_NATIVE_INT64, mspace, space, H5P_DEFAULT, &v);
    } else {
      std::vector<std::uint8_t> raw = fdp.ConsumeBytes<std::uint8_t>(H5Tget_size(type));
      raw.resize(H5Tget_size(type));
      H5Dwrite(d, type, mspace, space, H5P_DEFAULT, raw.data());
    }
    H5Sclose(mspace);
  }
  H5Sclose(space);
  H5Tclose(type);
  H5Dclose(d);
}

// Replaces a dataset by one of a new rank, shape and type; small ones get data.
void replace_dataset(hid_t file, const std::string& path, FuzzedDataProvider& fdp) {
  hid_t original = -1;
  if (hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT); d >= 0) {
    original = H5Dget_type(d);
    H5Dclose(d);
  }
  H5Ldelete(file, path.c_str(), H5P_DEFAULT);
  const int rank = fdp.ConsumeIntegralInRange(0, 4);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  long double total = 1;
  for (auto& x : dims) {
    x = edge_dim(fdp);
    total *= static_cast<long double>(x);
  }
  hid_t type = pick_type(fdp, original);
  if (original >= 0) H5Tclose(original);
  if (tracing()) {
    std::string shape;
    for (const hsize_t x : dims) shape += (shape.empty() ? "" : ", ") + std::to_string(x);
    trace("replace " + path + " by [" + shape + "] of class " + std::to_string(H5Tget_class(type)) +
          ", " + std::to_string(H5Tget_size(type)) + " bytes");
  }
  hid_t space = rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims.data(), nullptr);
  hid_t d = H5Dcreate2(file, path.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const long double bytes = total * static_cast<long double>(H5Tget_size(type));
  if (d >= 0 && bytes <= 65536 && fdp.ConsumeBool()) {
    std::vector<std::uint8_t> fill = fdp.ConsumeBytes<std::uint8_t>(16);
    if (fill.empty()) fill.push_back(0);
    std::vector<std::uint8_t> data(static_cast<std::size_t>(bytes));
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = fill[i % fill.size()];
    if (H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type) <= 0) {
      H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
    }
  }
  if (d >= 0) H5Dclose(d);
  H5Sclose(space);
  H5Tclose(type);
}

void edit_object(hid_t file, const Target& t, const std::vector<Target>& all,
                 FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange(0, 3)) {
    case 0:
      if (t.dataset) poke_dataset(file, t.object, fdp);
      break;
    case 1:
      if (t.dataset) replace_dataset(file, t.object, fdp);
      break;
    case 2:
      trace("unlink " + t.object);
      if (t.object != "/") H5Ldelete(file, t.object.c_str(), H5P_DEFAULT);
      break;
    default: {  // another name for an object: a duplicate layer, head or dataset
      const Target& src = all[fdp.ConsumeIntegralInRange<std::size_t>(0, all.size() - 1)];
      if (src.object == "/" || t.object == "/") break;
      const std::string parent = t.object.substr(0, t.object.rfind('/'));
      const std::string name = fdp.ConsumeBool() ? std::to_string(fdp.ConsumeIntegralInRange(0, 9))
                                                 : fdp.ConsumeRandomLengthString(12);
      const std::string dst = (parent.empty() ? "" : parent) + "/" + name;
      trace("link " + src.object + " as " + dst);
      if (H5Lexists(file, dst.c_str(), H5P_DEFAULT) > 0) H5Ldelete(file, dst.c_str(), H5P_DEFAULT);
      H5Lcreate_hard(file, src.object.c_str(), file, dst.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    }
  }
}

}  // namespace

void mutate_h5_copy(const std::string& template_path, const std::string& out_path,
                    FuzzedDataProvider& fdp) {
  copy_file_retrying(template_path, out_path);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t file = H5Fopen(out_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (file < 0) return;
  std::vector<std::string> objects = {"/"};
  H5Lvisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, collect_link, &objects);
  std::vector<Target> targets;
  for (const std::string& o : objects) {
    hid_t obj = H5Oopen(file, o.c_str(), H5P_DEFAULT);
    if (obj < 0) continue;
    targets.push_back({o, "", H5Iget_type(obj) == H5I_DATASET});
    std::vector<std::string> attrs;
    H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, collect_attr, &attrs);
    for (const std::string& a : attrs) targets.push_back({o, a, false});
    H5Oclose(obj);
  }
  const int edits = fdp.ConsumeIntegralInRange(1, 4);
  for (int i = 0; i < edits && !targets.empty(); ++i) {
    const Target& t = targets[fdp.ConsumeIntegralInRange<std::size_t>(0, targets.size() - 1)];
    if (!t.attr.empty()) {
      edit_attribute(file, t, fdp);
    } else {
      edit_object(file, t, targets, fdp);
    }
  }
  if (H5Fclose(file) < 0) trace("closing the edited file failed");
}

}  // namespace akv::fuzz
