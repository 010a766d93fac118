#include "akv/tensor/turboquant.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "akv/core/isa.h"
#include "akv/core/rng.h"
#include "akv/tensor/codes8.h"
#include "akv/tensor/half.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace akv {

int tq_code_bits(const TqType& t) { return t.kind == TqKind::key_qjl ? t.bits - 1 : t.bits; }
std::size_t tq_code_bytes(const TqType& t) { return (t.head_dim * static_cast<std::size_t>(tq_code_bits(t)) + 7) / 8; }

namespace {

constexpr std::array<std::size_t, 7> kHeadDims = {8, 16, 32, 64, 128, 256, 512};
constexpr std::array<int, 3> kBits = {2, 3, 4};
constexpr std::array<int, 4> kCodebookBits = {1, 2, 3, 4};  // key_qjl's levels take bits - 1

std::size_t log2_of(std::size_t d) {
  std::size_t l = 0;
  while ((std::size_t{1} << l) < d) ++l;
  return l;
}

bool supported(const TqType& t) {
  return std::find(kBits.begin(), kBits.end(), t.bits) != kBits.end() &&
         std::find(kHeadDims.begin(), kHeadDims.end(), t.head_dim) != kHeadDims.end();
}

std::uint32_t id_of(const TqType& t) {
  return kTqIdBase | (static_cast<std::uint32_t>(t.kind) << 8) | (static_cast<std::uint32_t>(t.bits) << 4) |
         static_cast<std::uint32_t>(log2_of(t.head_dim));
}

std::string name_of(const TqType& t) {
  const std::string b = std::to_string(t.bits), d = "_" + std::to_string(t.head_dim);
  switch (t.kind) {
    case TqKind::key: return "TQ" + b + d;
    case TqKind::key_nc: return "TQ" + b + "NC" + d;
    case TqKind::key_qjl: return "TQ" + b + "J" + d;
    default: return "TQV" + b + d;
  }
}

struct Table {
  std::vector<std::string> names;  // reserved up front: the c_str()s stay put
  std::vector<GgmlTypeInfo> types;
  Table() {
    const std::size_t n = 4 * kBits.size() * kHeadDims.size();
    names.reserve(n);
    types.reserve(n);
    for (TqKind k : {TqKind::key, TqKind::key_nc, TqKind::value, TqKind::key_qjl}) {
      for (int b : kBits) {
        for (std::size_t d : kHeadDims) {
          const TqType t{k, b, d};
          names.push_back(name_of(t));
          types.push_back({id_of(t), names.back().c_str(), d, tq_row_bytes(t)});
        }
      }
    }
  }
};

const Table& table() {
  static const Table t;
  return t;
}

// key_qjl: where the sign bits and gamma start.
std::size_t sign_offset(const TqType& t) { return tq_code_bytes(t) + 2; }
std::size_t gamma_offset(const TqType& t) { return sign_offset(t) + t.head_dim / 8; }

// Index i of a row's codes at bits [b i, b i + b) of the little-endian byte stream.
void pack(const std::uint32_t* q, std::size_t n, int bits, std::uint8_t* dst) {
  std::memset(dst, 0, (n * static_cast<std::size_t>(bits) + 7) / 8);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t bit = i * static_cast<std::size_t>(bits);
    const std::uint32_t v = q[i] << (bit % 8);
    dst[bit / 8] = static_cast<std::uint8_t>(dst[bit / 8] | (v & 0xFF));
    if ((bit % 8) + static_cast<std::size_t>(bits) > 8) dst[bit / 8 + 1] = static_cast<std::uint8_t>(dst[bit / 8 + 1] | (v >> 8));
  }
}

// A row's n indices (n a multiple of 8) into q, a byte each (pack's bit stream, read a byte at a
// time).
void unpack_row(const std::uint8_t* src, std::size_t n, int bits, std::uint8_t* q) {
  switch (bits) {
    case 4:
      for (std::size_t i = 0; i < n / 2; ++i) {
        q[2 * i] = src[i] & 0x0F;
        q[2 * i + 1] = src[i] >> 4;
      }
      return;
    case 2:
      for (std::size_t i = 0; i < n / 4; ++i) {
        for (int k = 0; k < 4; ++k) q[4 * i + static_cast<std::size_t>(k)] = (src[i] >> (2 * k)) & 3;
      }
      return;
    case 1:
      for (std::size_t i = 0; i < n; ++i) q[i] = (src[i / 8] >> (i % 8)) & 1;
      return;
    default:  // 3: eight indices in three bytes
      for (std::size_t g = 0; g < n / 8; ++g) {
        const std::uint32_t v = src[3 * g] | (static_cast<std::uint32_t>(src[3 * g + 1]) << 8) |
                                (static_cast<std::uint32_t>(src[3 * g + 2]) << 16);
        for (int k = 0; k < 8; ++k) q[8 * g + static_cast<std::size_t>(k)] = (v >> (3 * k)) & 7;
      }
  }
}

void put_f16(std::uint8_t* p, float x) {
  const std::uint16_t h = f32_to_f16_ref(x);
  std::memcpy(p, &h, 2);
}

float get_f16(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32_ref(h);
}

void encode_key(const TqType& t, const TqCodebook& cb, const float* x, std::uint8_t* dst) {
  float sq = 0.0f;
  for (std::size_t i = 0; i < t.head_dim; ++i) sq += x[i] * x[i];
  const float norm = std::sqrt(sq);
  const float den = norm + 1e-8f;
  std::uint32_t q[512];
  for (std::size_t i = 0; i < t.head_dim; ++i) {
    const float y = x[i] / den;
    std::uint32_t idx = 0;
    for (float m : cb.midpoints) idx += y >= m ? 1u : 0u;
    q[i] = idx;
  }
  pack(q, t.head_dim, tq_code_bits(t), dst);
  put_f16(dst + tq_code_bytes(t), norm);
}

void decode_key(const TqType& t, const TqCodebook& cb, const std::uint8_t* src, float* y) {
  std::uint8_t q[512];
  unpack_row(src, t.head_dim, tq_code_bits(t), q);
  for (std::size_t i = 0; i < t.head_dim; ++i) y[i] = cb.centroids[q[i]];
  if (t.kind == TqKind::key_nc) {
    // Eight partial sums (element i into lane i mod 8), reduced as ((s0 + s4) + (s2 + s6)) +
    // ((s1 + s5) + (s3 + s7)): independent lanes the compiler keeps in one register.
    float s[8] = {};
    for (std::size_t i = 0; i < t.head_dim; i += 8) {
      for (std::size_t l = 0; l < 8; ++l) s[l] += y[i + l] * y[i + l];
    }
    const float sq = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    const float inv = 1.0f / std::sqrt(sq + 1e-16f);
    for (std::size_t i = 0; i < t.head_dim; ++i) y[i] = y[i] * inv;
  }
  const float norm = get_f16(src + tq_code_bytes(t));
  for (std::size_t i = 0; i < t.head_dim; ++i) y[i] = norm * y[i];
}

#if defined(__AVX2__)
// NA x 8 outputs of the projection from j0, held in registers over the whole sum (the plain
// loop reads and writes p at every i): the same products and additions in the same order.
template <int NA>
void qjl_project_block(const float* St, const float* r, std::size_t d, std::size_t j0, float* p) {
  __m256 acc[NA];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (std::size_t i = 0; i < d; ++i) {
    const __m256 ri = _mm256_set1_ps(r[i]);
    const float* col = St + i * d + j0;
    for (int k = 0; k < NA; ++k) acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(_mm256_loadu_ps(col + 8 * k), ri));
  }
  for (int k = 0; k < NA; ++k) _mm256_storeu_ps(p + j0 + 8 * k, acc[k]);
}
#endif

// p = S r for St = S transposed: p_j = sum_i St[i d + j] r_i, each sum over i in order from 0
// (products rounded, then added: this file does not contract), eight outputs a register and 64
// at a time with AVX2 (head_dim a power of two from 8; generic: the plain loop).
void qjl_project(const float* St, const float* r, std::size_t d, float* p) {
#if defined(__AVX2__)
  if (active_isa() != Isa::generic) {
    switch (d) {
      case 8: return qjl_project_block<1>(St, r, d, 0, p);
      case 16: return qjl_project_block<2>(St, r, d, 0, p);
      case 32: return qjl_project_block<4>(St, r, d, 0, p);
      default:
        for (std::size_t j0 = 0; j0 < d; j0 += 64) qjl_project_block<8>(St, r, d, j0, p);
        return;
    }
  }
#endif
  std::fill_n(p, d, 0.0f);
  for (std::size_t i = 0; i < d; ++i) {
    const float ri = r[i];
    const float* col = St + i * d;
    for (std::size_t j = 0; j < d; ++j) p[j] += col[j] * ri;
  }
}

// key_qjl: the levels and norm as encode_key (no norm correction), then the residual's signs
// under S (qjl_project with St = S transposed: the same operations per output as a row of S times
// r, so the same bits) and its norm.
void encode_key_qjl(const TqType& t, const TqCodebook& cb, const float* St, const float* x, std::uint8_t* dst) {
  const std::size_t d = t.head_dim;
  encode_key(t, cb, x, dst);
  float r[512];
  decode_key(t, cb, dst, r);  // x_mse, from the stored levels and f16 norm
  float sq = 0.0f;
  for (std::size_t i = 0; i < d; ++i) {
    r[i] = x[i] - r[i];
    sq += r[i] * r[i];
  }
  float p[512];
  qjl_project(St, r, d, p);
  std::uint8_t* signs = dst + sign_offset(t);
  std::size_t j = 0;
#if defined(__AVX2__)
  if (active_isa() != Isa::generic) {  // eight p_j >= 0 (ordered: not NaN) as one byte
    for (; j + 8 <= d; j += 8) {
      const __m256 ge = _mm256_cmp_ps(_mm256_loadu_ps(p + j), _mm256_setzero_ps(), _CMP_GE_OQ);
      signs[j / 8] = static_cast<std::uint8_t>(_mm256_movemask_ps(ge));
    }
  }
#endif
  std::memset(signs + j / 8, 0, (d - j) / 8);
  for (; j < d; ++j) {
    if (p[j] >= 0.0f) signs[j / 8] = static_cast<std::uint8_t>(signs[j / 8] | (1u << (j % 8)));
  }
  put_f16(dst + gamma_offset(t), std::sqrt(sq));
}

void decode_key_qjl(const TqType& t, const TqCodebook& cb, const float* S, const std::uint8_t* src, float* y) {
  const std::size_t d = t.head_dim;
  decode_key(t, cb, src, y);
  float acc[512] = {};
  const std::uint8_t* signs = src + sign_offset(t);
  for (std::size_t j = 0; j < d; ++j) {
    const float* s = S + j * d;
    if ((signs[j / 8] >> (j % 8)) & 1u) {
      for (std::size_t i = 0; i < d; ++i) acc[i] += s[i];
    } else {
      for (std::size_t i = 0; i < d; ++i) acc[i] -= s[i];
    }
  }
  const float coef = static_cast<float>(std::sqrt(3.141592653589793 / 2.0) / static_cast<double>(d)) *
                     get_f16(src + gamma_offset(t));
  for (std::size_t i = 0; i < d; ++i) y[i] = y[i] + coef * acc[i];
}

void encode_value(const TqType& t, const float* x, std::uint8_t* dst) {
  const float levels = static_cast<float>((1 << t.bits) - 1);
  float mn = x[0], mx = x[0];
  for (std::size_t i = 1; i < t.head_dim; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  float scale = (mx - mn) / levels;
  if (!(scale > 1e-8f)) scale = 1e-8f;
  std::uint32_t q[512];
  for (std::size_t i = 0; i < t.head_dim; ++i) {
    const float r = (x[i] - mn) / scale + 0.5f;
    // trunc toward zero, then [0, levels] (NaN: 0)
    q[i] = r >= 1.0f ? static_cast<std::uint32_t>(std::min(r, levels)) : 0u;
  }
  pack(q, t.head_dim, t.bits, dst);
  put_f16(dst + tq_code_bytes(t), scale);
  put_f16(dst + tq_code_bytes(t) + 2, mn);
}

void decode_value(const TqType& t, const std::uint8_t* src, float* y) {
  const float scale = get_f16(src + tq_code_bytes(t)), zero = get_f16(src + tq_code_bytes(t) + 2);
  std::uint8_t q[512];
  unpack_row(src, t.head_dim, t.bits, q);
  for (std::size_t i = 0; i < t.head_dim; ++i) y[i] = static_cast<float>(q[i]) * scale + zero;
}

#if defined(__AVX2__)
// The same rows as decode_key / decode_value, eight elements per register: indices unpacked
// from their bytes, levels looked up with a permute (16 levels: two permutes and a blend), the
// norm correction's eight lanes as the plain loop keeps them, products in the same order.
void decode_key_avx2(const TqType& t, const TqCodebook& cb, const std::uint8_t* src, float* y) {
  const std::size_t levels = cb.centroids.size();
  float table[16] = {};
  std::memcpy(table, cb.centroids.data(), levels * sizeof(float));
  const __m256 lo = _mm256_loadu_ps(table), hi = _mm256_loadu_ps(table + 8);
  __m256 sq = _mm256_setzero_ps();
  for (std::size_t i = 0; i < t.head_dim; i += 8) {
    const __m256 c = lookup8(lo, hi, codes8_at(src, i, t.bits), levels == 16);
    sq = _mm256_add_ps(sq, _mm256_mul_ps(c, c));
    _mm256_storeu_ps(y + i, c);
  }
  const float norm = get_f16(src + tq_code_bytes(t));
  const __m256 nv = _mm256_set1_ps(norm);
  __m256 inv = _mm256_set1_ps(1.0f);
  if (t.kind == TqKind::key_nc) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(sq), _mm256_extractf128_ps(sq, 1));  // s_l + s_{l+4}
    const __m128 u = _mm_add_ps(s, _mm_movehl_ps(s, s));
    const float total = _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
    inv = _mm256_set1_ps(1.0f / std::sqrt(total + 1e-16f));
  }
  for (std::size_t i = 0; i < t.head_dim; i += 8) {
    __m256 c = _mm256_loadu_ps(y + i);
    if (t.kind == TqKind::key_nc) c = _mm256_mul_ps(c, inv);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(nv, c));
  }
}

void decode_value_avx2(const TqType& t, const std::uint8_t* src, float* y) {
  const __m256 scale = _mm256_set1_ps(get_f16(src + tq_code_bytes(t)));
  const __m256 zero = _mm256_set1_ps(get_f16(src + tq_code_bytes(t) + 2));
  for (std::size_t i = 0; i < t.head_dim; i += 8) {
    const __m256 q = _mm256_cvtepi32_ps(codes8_at(src, i, t.bits));
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_mul_ps(q, scale), zero));
  }
}
#endif

// vLLM's _trapz: the trapezoidal rule on n intervals.
template <typename F>
double trapz(F f, double a, double b, int n = 200) {
  const double h = (b - a) / n;
  double r = 0.5 * (f(a) + f(b));
  for (int i = 1; i < n; ++i) r += f(a + i * h);
  return r * h;
}

// vLLM's Lloyd-Max solver in double (tq_codebook's levels before their rounding to f32).
std::vector<double> tq_lloyd_max(std::size_t head_dim, int bits) {
  const int n = 1 << bits;
  const double sigma2 = 1.0 / static_cast<double>(head_dim);
  const double sigma = std::sqrt(sigma2);
  const double pi = 3.141592653589793;  // math.pi
  auto pdf = [&](double x) { return (1.0 / std::sqrt(2 * pi * sigma2)) * std::exp(-x * x / (2 * sigma2)); };
  const double lo = -3.5 * sigma, hi = 3.5 * sigma;
  std::vector<double> c(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) c[static_cast<std::size_t>(i)] = lo + (hi - lo) * (i + 0.5) / n;
  for (int it = 0; it < 200; ++it) {
    std::vector<double> edges = {lo * 3};
    for (int i = 0; i + 1 < n; ++i) edges.push_back((c[static_cast<std::size_t>(i)] + c[static_cast<std::size_t>(i) + 1]) / 2.0);
    edges.push_back(hi * 3);
    std::vector<double> next(c.size());
    double moved = 0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      const double a = edges[i], b = edges[i + 1];
      const double num = trapz([&](double x) { return x * pdf(x); }, a, b);
      const double den = trapz(pdf, a, b);
      next[i] = den > 1e-15 ? num / den : c[i];
      moved = std::max(moved, std::fabs(next[i] - c[i]));
    }
    if (moved < 1e-10) break;
    c = std::move(next);
  }
  return c;
}

}  // namespace

std::size_t tq_row_bytes(const TqType& t) {
  if (t.kind == TqKind::key_qjl) return gamma_offset(t) + 2;
  return tq_code_bytes(t) + (t.kind == TqKind::value ? 4 : 2);
}

const GgmlTypeInfo* tq_type_info(const TqType& t) {
  if (!supported(t)) return nullptr;
  const std::uint32_t id = id_of(t);
  for (const GgmlTypeInfo& g : table().types) {
    if (g.id == id) return &g;
  }
  return nullptr;
}

std::optional<TqType> tq_type_of(const GgmlTypeInfo& type) {
  if ((type.id & 0xFFFF0000u) != kTqIdBase) return std::nullopt;
  TqType t;
  t.kind = static_cast<TqKind>((type.id >> 8) & 0xFF);
  t.bits = static_cast<int>((type.id >> 4) & 0xF);
  t.head_dim = std::size_t{1} << (type.id & 0xF);
  return t;
}

const std::vector<GgmlTypeInfo>& tq_type_table() { return table().types; }

const TqCodebook& tq_codebook(std::size_t head_dim, int bits) {
  // One slot per supported (head_dim, bits), each computed once: the attention path asks per
  // tile from several threads, so the lookup takes no lock once a slot is filled.
  struct Slot {
    std::once_flag once;
    TqCodebook book;
  };
  static std::array<Slot, kHeadDims.size() * kCodebookBits.size()> slots;
  const auto d = std::find(kHeadDims.begin(), kHeadDims.end(), head_dim);
  const auto b = std::find(kCodebookBits.begin(), kCodebookBits.end(), bits);
  if (d == kHeadDims.end() || b == kCodebookBits.end()) throw std::invalid_argument("tq_codebook: unsupported head_dim or bits");
  Slot& s = slots[static_cast<std::size_t>(d - kHeadDims.begin()) * kCodebookBits.size() +
                  static_cast<std::size_t>(b - kCodebookBits.begin())];
  std::call_once(s.once, [&] {
    for (double c : tq_lloyd_max(head_dim, bits)) s.book.centroids.push_back(static_cast<float>(c));
    for (std::size_t i = 0; i + 1 < s.book.centroids.size(); ++i) {
      s.book.midpoints.push_back((s.book.centroids[i] + s.book.centroids[i + 1]) / 2.0f);
    }
  });
  return s.book;
}

namespace {

// S and its transpose for one head_dim, computed once.
struct QjlMatrix {
  std::once_flag once;
  std::vector<float> s, t;
};

const QjlMatrix& qjl_matrix(std::size_t head_dim) {
  static std::array<QjlMatrix, kHeadDims.size()> slots;
  const auto d = std::find(kHeadDims.begin(), kHeadDims.end(), head_dim);
  if (d == kHeadDims.end()) throw std::invalid_argument("tq_qjl_matrix: unsupported head_dim");
  QjlMatrix& m = slots[static_cast<std::size_t>(d - kHeadDims.begin())];
  std::call_once(m.once, [&] {
    Rng rng(stream_seed(kTqQjlSeed, {head_dim}));
    m.s.resize(head_dim * head_dim);
    for (float& v : m.s) v = static_cast<float>(rng.normal());
    m.t.resize(m.s.size());
    for (std::size_t j = 0; j < head_dim; ++j) {
      for (std::size_t i = 0; i < head_dim; ++i) m.t[i * head_dim + j] = m.s[j * head_dim + i];
    }
  });
  return m;
}

}  // namespace

const std::vector<float>& tq_qjl_matrix(std::size_t head_dim) { return qjl_matrix(head_dim).s; }

namespace {

void qjl_encode_rows(const TqType& t, const float* St, const float* x, std::size_t n, std::uint8_t* dst) {
  const std::size_t rb = tq_row_bytes(t);
  const TqCodebook& cb = tq_codebook(t.head_dim, tq_code_bits(t));
  for (std::size_t r = 0; r < n; ++r) encode_key_qjl(t, cb, St, x + r * t.head_dim, dst + r * rb);
}

}  // namespace

void tq_qjl_encode_rows(const TqType& t, const float* S, const float* x, std::size_t n, std::uint8_t* dst) {
  if (t.kind != TqKind::key_qjl) throw std::invalid_argument("tq_qjl_encode_rows: not a key_qjl type");
  const std::size_t d = t.head_dim;
  std::vector<float> St(d * d);
  for (std::size_t j = 0; j < d; ++j) {
    for (std::size_t i = 0; i < d; ++i) St[i * d + j] = S[j * d + i];
  }
  qjl_encode_rows(t, St.data(), x, n, dst);
}

void tq_qjl_decode_rows(const TqType& t, const float* S, const std::uint8_t* src, std::size_t n, float* dst) {
  if (t.kind != TqKind::key_qjl) throw std::invalid_argument("tq_qjl_decode_rows: not a key_qjl type");
  const std::size_t rb = tq_row_bytes(t);
  const TqCodebook& cb = tq_codebook(t.head_dim, tq_code_bits(t));
  for (std::size_t r = 0; r < n; ++r) decode_key_qjl(t, cb, S, src + r * rb, dst + r * t.head_dim);
}

TqQjlQuery tq_qjl_query(const TqType& t, const float* q, bool tables) {
  const std::size_t d = t.head_dim;
  // sq_j = sum_i S_ji q_i, each over i in order; as S^T's rows times q_i, so that the loop over
  // j vectorizes (the same operations per j: the same bits). With AVX2 64 of the sums at a time
  // stay in registers over i (through memory each i's adds waited on the last i's stores: 2.6% of
  // a QJL4 decode step at GQA 4, AMD EPYC Zen 4).
  const std::vector<float>& St = qjl_matrix(d).t;
  std::vector<float> sq(d, 0.0f);
#if defined(__AVX2__)
  if (d % 64 == 0) {
    for (std::size_t j0 = 0; j0 < d; j0 += 64) {
      __m256 acc[8];
      for (auto& a : acc) a = _mm256_setzero_ps();
      for (std::size_t i = 0; i < d; ++i) {
        const __m256 qi = _mm256_set1_ps(q[i]);
        const float* col = St.data() + i * d + j0;
        for (int k = 0; k < 8; ++k) acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(_mm256_loadu_ps(col + 8 * k), qi));
      }
      for (int k = 0; k < 8; ++k) _mm256_storeu_ps(sq.data() + j0 + 8 * k, acc[k]);
    }
  } else
#endif
  {
    for (std::size_t i = 0; i < d; ++i) {
      const float qi = q[i];
      const float* col = St.data() + i * d;
      for (std::size_t j = 0; j < d; ++j) sq[j] += col[j] * qi;
    }
  }
  TqQjlQuery out;
  for (const float x : sq) out.sq_sum += x;
  if (!tables) {
    out.sq = std::move(sq);
    return out;
  }
  out.table.resize(d / 8 * 256);
  for (std::size_t k = 0; k < d / 8; ++k) {
    float* tab = out.table.data() + 256 * k;
    float base = 0.0f;
    for (std::size_t i = 0; i < 8; ++i) base -= sq[8 * k + i];
    tab[0] = base;
    for (unsigned b = 1; b < 256; ++b) {
      tab[b] = tab[b & (b - 1)] + 2.0f * sq[8 * k + static_cast<std::size_t>(__builtin_ctz(b))];
    }
  }
  out.sq = std::move(sq);
  return out;
}

void tq_qjl_decode_levels(const TqType& t, const std::uint8_t* src, std::size_t n, float* dst) {
  if (t.kind != TqKind::key_qjl) throw std::invalid_argument("tq_qjl_decode_levels: not a key_qjl type");
  const std::size_t rb = tq_row_bytes(t);
  const TqCodebook& cb = tq_codebook(t.head_dim, tq_code_bits(t));
#if defined(__AVX2__)
  // The levels and norm lead the row as a TQ<b-1> key row's (no norm correction).
  const TqType levels{TqKind::key, tq_code_bits(t), t.head_dim};
  if (active_isa() >= Isa::avx2) {
    for (std::size_t r = 0; r < n; ++r) decode_key_avx2(levels, cb, src + r * rb, dst + r * t.head_dim);
    return;
  }
#endif
  for (std::size_t r = 0; r < n; ++r) decode_key(t, cb, src + r * rb, dst + r * t.head_dim);
}

std::size_t tq_qjl_sign_offset(const TqType& t) { return sign_offset(t); }
std::size_t tq_qjl_gamma_offset(const TqType& t) { return gamma_offset(t); }
void tq_qjl_factors(const TqType& t, const std::uint16_t* gamma, std::size_t n, float* coef) {
  const float scale = static_cast<float>(std::sqrt(3.141592653589793 / 2.0) / static_cast<double>(t.head_dim));
  f16_to_f32(gamma, coef, n);
  for (std::size_t r = 0; r < n; ++r) coef[r] *= scale;
}

void tq_qjl_coefficients(const TqType& t, const std::uint8_t* src, std::size_t n, float* coef) {
  const std::size_t rb = tq_row_bytes(t);
  std::uint16_t gamma[64];
  for (std::size_t r0 = 0; r0 < n; r0 += 64) {
    const std::size_t m = std::min<std::size_t>(64, n - r0);
    for (std::size_t r = 0; r < m; ++r) std::memcpy(&gamma[r], src + (r0 + r) * rb + gamma_offset(t), 2);
    tq_qjl_factors(t, gamma, m, coef + r0);
  }
}

void tq_qjl_add_scores(const TqType& t, const TqQjlQuery* q, std::size_t nq, const std::uint8_t* src, std::size_t n,
                       float* s, std::size_t stride) {
  const std::size_t d = t.head_dim, rb = tq_row_bytes(t);
  float coef[64];
  for (std::size_t r0 = 0; r0 < n; r0 += 64) {
    const std::size_t m = std::min<std::size_t>(64, n - r0);
    tq_qjl_coefficients(t, src + r0 * rb, m, coef);
    for (std::size_t h = 0; h < nq; ++h) {
      const float* table = q[h].table.data();
      float* out = s + h * stride + r0;
      std::size_t r = 0;
      for (; r + 4 <= m; r += 4) {  // four rows' sums side by side (each its own chain of additions)
        const std::uint8_t* g = src + (r0 + r) * rb + sign_offset(t);
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (std::size_t k = 0; k < d / 8; ++k) {
          const float* tk = table + 256 * k;
          s0 += tk[g[k]];
          s1 += tk[g[rb + k]];
          s2 += tk[g[2 * rb + k]];
          s3 += tk[g[3 * rb + k]];
        }
        out[r] += coef[r] * s0;
        out[r + 1] += coef[r + 1] * s1;
        out[r + 2] += coef[r + 2] * s2;
        out[r + 3] += coef[r + 3] * s3;
      }
      for (; r < m; ++r) {
        const std::uint8_t* signs = src + (r0 + r) * rb + sign_offset(t);
        float sum = 0.0f;
        for (std::size_t k = 0; k < d / 8; ++k) sum += table[256 * k + signs[k]];
        out[r] += coef[r] * sum;
      }
    }
  }
}

void tq_encode_rows(const TqType& t, const float* x, std::size_t n, std::uint8_t* dst) {
  if (t.kind == TqKind::key_qjl) return qjl_encode_rows(t, qjl_matrix(t.head_dim).t.data(), x, n, dst);
  const std::size_t rb = tq_row_bytes(t);
  if (t.kind == TqKind::value) {
    for (std::size_t r = 0; r < n; ++r) encode_value(t, x + r * t.head_dim, dst + r * rb);
    return;
  }
  const TqCodebook& cb = tq_codebook(t.head_dim, t.bits);
  for (std::size_t r = 0; r < n; ++r) encode_key(t, cb, x + r * t.head_dim, dst + r * rb);
}

void tq_decode_rows(const TqType& t, const std::uint8_t* src, std::size_t n, float* dst) {
  if (t.kind == TqKind::key_qjl) return tq_qjl_decode_rows(t, tq_qjl_matrix(t.head_dim).data(), src, n, dst);
  const std::size_t rb = tq_row_bytes(t);
#if defined(__AVX2__)
  if (active_isa() >= Isa::avx2) {
    if (t.kind == TqKind::value) {
      for (std::size_t r = 0; r < n; ++r) decode_value_avx2(t, src + r * rb, dst + r * t.head_dim);
      return;
    }
    const TqCodebook& cb = tq_codebook(t.head_dim, t.bits);
    for (std::size_t r = 0; r < n; ++r) decode_key_avx2(t, cb, src + r * rb, dst + r * t.head_dim);
    return;
  }
#endif
  if (t.kind == TqKind::value) {
    for (std::size_t r = 0; r < n; ++r) decode_value(t, src + r * rb, dst + r * t.head_dim);
    return;
  }
  const TqCodebook& cb = tq_codebook(t.head_dim, t.bits);
  for (std::size_t r = 0; r < n; ++r) decode_key(t, cb, src + r * rb, dst + r * t.head_dim);
}

std::size_t tq_first_nonfinite(const TqType& t, const std::uint8_t* src, std::size_t n) {
  const std::size_t rb = tq_row_bytes(t);
  // The f16 fields: norm (keys), scale and minimum (values), norm and gamma (key_qjl).
  const std::size_t second = t.kind == TqKind::value ? tq_code_bytes(t) + 2 : t.kind == TqKind::key_qjl ? gamma_offset(t) : 0;
  const auto nonfinite = [](const std::uint8_t* p) {
    std::uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_nonfinite(h);
  };
  for (std::size_t r = 0; r < n / t.head_dim; ++r) {
    if (nonfinite(src + r * rb + tq_code_bytes(t)) || (second && nonfinite(src + r * rb + second))) return r * t.head_dim;
  }
  return n;
}

}  // namespace akv
