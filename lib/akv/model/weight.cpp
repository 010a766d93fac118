#include "akv/model/weight.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/tensor/half.h"
#include "akv/tensor/linear.h"
#include "akv/tensor/q8_dot.h"

namespace akv {
namespace {

constexpr std::size_t kTileFloats = 1u << 16;  // f32 values per converted tile (256 KB)
// Vectors up to which block-type rows (q8 products: q8_rows_blocks) and 16-bit rows
// (linear_rows_16) are multiplied where they lie rather than through a converted tile: the same
// bits either way.
constexpr std::size_t kBlockVectors = 2;

}  // namespace

WeightMode parse_weight_mode(const std::string& name) {
  if (name == "stored") return WeightMode::stored;
  if (name == "f32") return WeightMode::f32;
  if (name == "q8") return WeightMode::q8;
  throw InvalidInput("unknown weight mode (expected stored, f32 or q8)", {"", "--weights", name});
}

MappedFile::MappedFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot open model file", {path});
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw IoError("cannot stat model file", {path});
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  if (size_ > 0) {
    // MAP_POPULATE: the loader reads every weight at once (the finiteness check), so the pages
    // are mapped in one pass instead of one fault each.
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw IoError("cannot memory-map model file", {path});
    }
    data_ = static_cast<const std::uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

Weight::Weight(RowMatrix m)
    : rows_(static_cast<std::size_t>(m.rows())), cols_(static_cast<std::size_t>(m.cols())), m_(std::move(m)) {}

Weight Weight::encoded(std::size_t rows, std::size_t cols, const GgmlTypeInfo& type, const std::uint8_t* data,
                       std::shared_ptr<const void> owner, bool q8_products) {
  Weight w;
  w.rows_ = rows;
  w.cols_ = cols;
  w.type_ = &type;
  w.data_ = data;
  w.row_bytes_ = cols / type.block * type.bytes;
  w.q8_ = q8_products && q8_decodes(type);
  w.owner_ = std::move(owner);
  return w;
}

std::string Weight::dtype() const { return type_ ? type_->name : "F32"; }

std::uint64_t Weight::bytes() const {
  return type_ ? static_cast<std::uint64_t>(rows_) * row_bytes_ : static_cast<std::uint64_t>(rows_) * cols_ * 4;
}

std::size_t Weight::tile_rows() const { return std::max<std::size_t>(1, std::min(rows_, kTileFloats / std::max<std::size_t>(cols_, 1))); }

void Weight::convert_rows(std::size_t r0, std::size_t n, float* out, std::vector<std::uint16_t>& scratch) const {
  const std::uint8_t* src = data_ + r0 * row_bytes_;
  if (type_->id == 1 || type_->id == 30) {
    // 16-bit rows may sit at odd offsets of a safetensors file: those go through aligned scratch.
    const std::size_t count = n * cols_;
    const std::uint16_t* h = reinterpret_cast<const std::uint16_t*>(src);
    if (reinterpret_cast<std::uintptr_t>(src) % alignof(std::uint16_t) != 0) {
      scratch.resize(count);
      std::memcpy(scratch.data(), src, count * 2);
      h = scratch.data();
    }
    if (type_->id == 1) f16_to_f32(h, out, count);
    else bf16_to_f32(h, out, count);
    return;
  }
  ggml_dequantize(*type_, src, n * cols_, out);
}

RowMatrix Weight::times_transpose(const RowMatrix& x, int threads, Products p) const {
  if (static_cast<std::size_t>(x.cols()) != cols_) throw std::logic_error("Weight::times_transpose: shape mismatch");
  RowMatrix y(x.rows(), static_cast<Eigen::Index>(rows_));
  times_rows(x.data(), static_cast<std::size_t>(x.rows()), cols_, y.data(), rows_, threads, p);
  return y;
}

void Weight::times_rows_q8(const float* x, std::size_t batch, std::size_t ldx, float* y, std::size_t ldy,
                           int threads) const {
  const std::size_t block = tile_rows(), n_blocks = (rows_ + block - 1) / block;
  // X rounded to 8-bit blocks once for every block of rows, slice by slice for a long X (16 MB
  // of codes at a time).
  const std::size_t slice = std::max<std::size_t>(1, (std::size_t{16} << 20) / cols_);
  Q8Vectors xq;
  for (std::size_t b0 = 0; b0 < batch; b0 += slice) {
    q8_quantize(x + b0 * ldx, std::min(slice, batch - b0), cols_, ldx, xq, threads);
    float* yb = y + b0 * ldy;
    parallel_for(n_blocks, threads, [&](std::size_t i) {
      const std::size_t r0 = i * block, n = std::min(block, rows_ - r0);
      if (xq.batch <= kBlockVectors && q8_rows_blocks(*type_, data_ + r0 * row_bytes_, n, xq, yb + r0, ldy)) return;
      thread_local Q8Tile tile;
      q8_decode(*type_, data_ + r0 * row_bytes_, n, cols_, tile);
      q8_rows(tile, xq, yb + r0, ldy);
    });
  }
}

void Weight::times_rows(const float* x, std::size_t batch, std::size_t ldx, float* y, std::size_t ldy,
                        int threads, Products p) const {
  if (q8_ && p == Products::loaded) return times_rows_q8(x, batch, ldx, y, ldy, threads);
  constexpr std::size_t kF32Block = 64;  // rows per work item of an f32-resident weight
  const std::size_t block = type_ && type_->id != 0 ? tile_rows() : kF32Block;
  const std::size_t n_blocks = (rows_ + block - 1) / block;
  const float* f32_rows = !type_ ? m_.data() : type_->id == 0 ? reinterpret_cast<const float*>(data_) : nullptr;
  if (type_ && (type_->id == 1 || type_->id == 30) && batch <= kBlockVectors) {
    // 16-bit rows read in place, widened in registers: the bits of the tile path below.
    parallel_for(n_blocks, threads, [&](std::size_t i) {
      const std::size_t r0 = i * block, n = std::min(block, rows_ - r0);
      linear_rows_16(data_ + r0 * row_bytes_, type_->id == 30, n, cols_, cols_, x, batch, ldx, y + r0, ldy);
    });
    return;
  }
  // X prepared once for every block of rows (LinearInput), slice by slice for a long X (a
  // prefill's), each slice over all of W's rows.
  const std::size_t slice = linear_input_slice(cols_);
  for (std::size_t b0 = 0; b0 < batch; b0 += slice) {
    const LinearInput in(x + b0 * ldx, std::min(slice, batch - b0), cols_, ldx);
    float* yb = y + b0 * ldy;
    parallel_for(n_blocks, threads, [&](std::size_t i) {
      const std::size_t r0 = i * block, n = std::min(block, rows_ - r0);
      if (f32_rows) {
        linear_rows(f32_rows + r0 * cols_, n, cols_, in, yb + r0, ldy);
        return;
      }
      thread_local std::vector<float> tile;
      thread_local std::vector<std::uint16_t> scratch;
      tile.resize(n * cols_);
      convert_rows(r0, n, tile.data(), scratch);
      linear_rows(tile.data(), n, cols_, in, yb + r0, ldy);
    });
  }
}

void Weight::row(std::size_t r, float* out) const {
  if (!type_) {
    std::memcpy(out, m_.row(static_cast<Eigen::Index>(r)).data(), cols_ * sizeof(float));
    return;
  }
  std::vector<std::uint16_t> scratch;
  convert_rows(r, 1, out, scratch);
}

RowMatrix Weight::to_f32() const {
  if (!type_) return m_;
  RowMatrix m(static_cast<Eigen::Index>(rows_), static_cast<Eigen::Index>(cols_));
  std::vector<std::uint16_t> scratch;
  convert_rows(0, rows_, m.data(), scratch);
  return m;
}

const RowMatrix& Weight::f32() const {
  if (type_) throw std::logic_error("weight is not f32-resident");
  return m_;
}

RowMatrix& Weight::f32() {
  if (type_) throw std::logic_error("weight is not f32-resident");
  return m_;
}

}  // namespace akv
