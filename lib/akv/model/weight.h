#pragma once
// A weight matrix [rows, cols] (y = W x), resident either as f32 or in the encoding its file
// stores (F32, F16, BF16 or a ggml block type), in memory or in a read-only memory map of the
// file. Mapped F32 rows are multiplied in place (loading copies nothing), and so are F16/BF16
// rows for one or two vectors (linear_rows_16); otherwise encoded weights
// are converted to f32 a tile of rows at a time inside each product, so an 8B-parameter bf16
// checkpoint needs its 16 GB and a few hundred KB of tiles, not 32 GB (docs/model.md, "Weights in
// memory"). Every such product runs linear.h's fixed-order kernel over f32 rows, so a weight
// gives the same bits whether f32-resident, mapped or converted per tile. Block-type weights
// loaded for q8 products (WeightMode::q8) multiply as llama.cpp's CPU backend does instead, in
// integers against activations rounded to 8-bit blocks (q8_dot.h), within that rounding of the
// f32 product.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "akv/tensor/ggml_blocks.h"
#include "akv/tensor/tensor.h"

namespace akv {

// How loaders keep weights: `stored` = as the file encodes them (f32 files stay f32), `f32` =
// converted to f32 on load, `q8` = as stored, block types multiplied in integers against
// activations rounded to 8-bit blocks (q8_dot.h) where a call asks for the loaded products
// (Products below: the model's decode steps; F32/F16/BF16 as `stored`).
enum class WeightMode { stored, f32, q8 };
WeightMode parse_weight_mode(const std::string& name);  // "stored" | "f32" | "q8"; InvalidInput naming the value

// A read-only memory map of a whole file (shared by the weights that point into it).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // IoError naming the file
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const std::uint8_t* data() const { return data_; }
  std::uint64_t size() const { return size_; }

 private:
  const std::uint8_t* data_ = nullptr;
  std::uint64_t size_ = 0;
};

// Which product a call asks for: `loaded` = as the weight was loaded (q8 products for a
// WeightMode::q8 block type), `f32` = linear.h's exact f32 product whatever the mode (the model's
// prefill: many vectors share each tile, where the f32 blocks are the faster path).
enum class Products { loaded, f32 };

class Weight {
 public:
  Weight() = default;
  Weight(RowMatrix m);  // f32-resident (implicit, as the loaders and tests build weights)
  // Encoded rows at `data` (rows * cols / type.block blocks, row after row; F32 data 4-byte
  // aligned), kept alive by `owner` (a MappedFile, or owned bytes).
  // q8_products: block types multiply through q8_dot.h (ignored for F32/F16/BF16).
  static Weight encoded(std::size_t rows, std::size_t cols, const GgmlTypeInfo& type, const std::uint8_t* data,
                        std::shared_ptr<const void> owner, bool q8_products = false);

  std::size_t rows() const { return rows_; }
  std::size_t cols() const { return cols_; }
  bool empty() const { return rows_ == 0; }
  bool is_f32() const { return type_ == nullptr; }
  bool q8_products() const { return q8_; }
  std::string dtype() const;               // "F32", "BF16", "Q4_K"...
  std::uint64_t bytes() const;             // bytes the weight occupies as resident

  // [n, cols] -> [n, rows] = x W^T (times_rows on `threads` threads: the same bits for any count).
  RowMatrix times_transpose(const RowMatrix& x, int threads = 1, Products p = Products::loaded) const;
  // y [batch, rows] (row stride ldy) = x [batch, cols] (row stride ldx) W^T, each output in
  // linear.h's fixed summation order (q8 products: q8_dot.h's): blocks of rows on `threads`
  // threads (encoded weights converted a tile per block), every row of W read once for the whole
  // batch. Bit-identical for any batch size and thread count.
  void times_rows(const float* x, std::size_t batch, std::size_t ldx, float* y, std::size_t ldy, int threads,
                  Products p = Products::loaded) const;
  void row(std::size_t r, float* out) const;            // row r as f32 (embedding lookup)
  RowMatrix to_f32() const;
  // The f32 matrix of an f32-resident weight (std::logic_error otherwise).
  const RowMatrix& f32() const;
  RowMatrix& f32();

 private:
  // Rows [r0, r0 + n) as f32 into out [n, cols]; `scratch` holds misaligned 16-bit rows.
  void convert_rows(std::size_t r0, std::size_t n, float* out, std::vector<std::uint16_t>& scratch) const;
  std::size_t tile_rows() const;
  // times_rows with q8 products: q8_dot.h's integer products.
  void times_rows_q8(const float* x, std::size_t batch, std::size_t ldx, float* y, std::size_t ldy, int threads) const;

  std::size_t rows_ = 0, cols_ = 0;
  RowMatrix m_;                          // f32-resident
  const GgmlTypeInfo* type_ = nullptr;   // encoded
  const std::uint8_t* data_ = nullptr;
  std::size_t row_bytes_ = 0;
  bool q8_ = false;
  std::shared_ptr<const void> owner_;
};

}  // namespace akv
