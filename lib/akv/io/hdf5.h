#pragma once
// Thin RAII layer over the HDF5 C API, used by the akv file containers. Every failure becomes an
// akv error naming the file and the object; the HDF5 error stack printer is switched off.
#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "akv/core/atomic_file.h"

namespace akv::h5 {

// Owns one HDF5 identifier and closes it with the matching H5*close function.
template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // A close that fails (a file that cannot be flushed: disk full, file-size limit) leaves the
  // identifier in HDF5's tables, and HDF5 1.10 crashes closing it again when the process exits:
  // the process then ends without exit handlers (request_quick_exit, core/atomic_file.h).
  void reset() {
    if (id_ >= 0 && Close(id_) < 0) request_quick_exit();
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

using File = Handle<H5Fclose>;
using Group = Handle<H5Gclose>;
using Dataset = Handle<H5Dclose>;
using Space = Handle<H5Sclose>;
using Type = Handle<H5Tclose>;
using Attribute = Handle<H5Aclose>;
using PropList = Handle<H5Pclose>;

// Switches off HDF5's automatic error printing (idempotent).
void silence_errors();

// Opens an existing file read-only. Missing or unreadable -> IoError (exit 3); not HDF5 or
// damaged (truncated, bad superblock) -> CorruptData (exit 2).
File open_read(const std::string& path);
// Creates (truncates) a file for writing, without object timestamps so that identical content
// gives identical bytes. IoError naming `shown` (the output's final name when `path` is its
// temporary file), `path` when `shown` is empty.
File create(const std::string& path, const std::string& shown = {});

// Dataset creation properties without object timestamps (deterministic bytes).
PropList dataset_create_props();
// Creates a group (and missing parents) without timestamps.
Group create_group(hid_t loc, const std::string& path);

bool link_exists(hid_t loc, const std::string& path);
bool attr_exists(hid_t obj, const std::string& name);

// Attribute readers; throw InvalidInput naming `file` and `field` (the attribute's full name) if
// the attribute is missing, has the wrong class or is not a scalar.
std::string read_attr_string(hid_t obj, const std::string& name, const std::string& file,
                             const std::string& field);
std::int64_t read_attr_int(hid_t obj, const std::string& name, const std::string& file,
                           const std::string& field);
double read_attr_double(hid_t obj, const std::string& name, const std::string& file,
                        const std::string& field);

void write_attr_string(hid_t obj, const std::string& name, const std::string& value);
void write_attr_int(hid_t obj, const std::string& name, std::int64_t value);
void write_attr_double(hid_t obj, const std::string& name, double value);

// Dataset helpers.
Dataset open_dataset(hid_t loc, const std::string& path, const std::string& file);
std::vector<hsize_t> dataset_shape(hid_t dset);
std::uint64_t storage_bytes(hid_t dset);
// The bytes a dataset's shape and element type declare must be in the file before anything is
// allocated for them: at most its stored bytes, or 1032 times them when the dataset is filtered
// (compressed; 1032:1 is DEFLATE's largest ratio). A dataset that was never written, or whose
// shape claims more than its bytes hold, is CorruptData naming `path`; a shape whose size
// overflows 64 bits is InvalidInput. Returns the declared element count.
std::uint64_t check_stored(hid_t dset, const std::string& file, const std::string& path);
std::string shape_string(const std::vector<hsize_t>& shape);  // "[8, 1024, 128]"

// On-disk floating-point element types akv reads. Writers use f16, bf16 and f32.
enum class DiskFloat { f16, bf16, f32, f64 };
std::string disk_float_name(DiskFloat t);
// Classifies a dataset's type; nullopt when akv cannot read it.
std::optional<DiskFloat> classify_float(hid_t type);
// A little-endian IEEE binary16 / bfloat16 type, as h5py and numpy create them (caller owns).
Type make_f16_type();
Type make_bf16_type();

// Reads an integer 1-D dataset into int64 (HDF5 converts any integer width).
std::vector<std::int64_t> read_int_vector(hid_t loc, const std::string& path,
                                          const std::string& file);
// Reads a 1-D dataset of strings (variable or fixed length).
std::vector<std::string> read_string_vector(hid_t loc, const std::string& path,
                                            const std::string& file);
// Writes a 1-D dataset of variable-length UTF-8 strings (h5py's default for str).
void write_string_vector(hid_t loc, const std::string& path,
                         const std::vector<std::string>& values);
// Writes an n-D dataset (contiguous, no timestamps) of `file_type` from memory of `mem_type`.
void write_dataset(hid_t loc, const std::string& path, hid_t file_type, hid_t mem_type,
                   const std::vector<hsize_t>& dims, const void* data);
// Checks that the dataset at `path` has shape `dims` (CorruptData naming the dataset, the
// expected and the stored shape) and passes check_stored(); returns the element count.
std::uint64_t check_dataset(hid_t loc, const std::string& path, const std::vector<hsize_t>& dims,
                            const std::string& file);
// Reads a whole dataset that passes check_dataset() into memory of `mem_type`.
void read_dataset(hid_t loc, const std::string& path, hid_t mem_type,
                  const std::vector<hsize_t>& dims, void* data, const std::string& file);
// read_dataset() into a vector it allocates only after the shape and the stored size check out.
template <class T>
std::vector<T> read_vector(hid_t loc, const std::string& path, hid_t mem_type,
                           const std::vector<hsize_t>& dims, const std::string& file) {
  const std::uint64_t n = check_dataset(loc, path, dims, file);
  std::vector<T> out(static_cast<std::size_t>(n));
  read_dataset(loc, path, mem_type, dims, out.data(), file);
  return out;
}

// Writes a 1-D int32 dataset.
void write_int32_vector(hid_t loc, const std::string& path, const std::vector<std::int32_t>& v);

}  // namespace akv::h5
