#include "akv/quant/pack.h"

#include <cstring>
#include <string>

#include "akv/core/errors.h"

namespace akv {

bool is_supported_bits(int bits) { return bits == 2 || bits == 3 || bits == 4 || bits == 8; }

void check_bits(int bits, const char* field) {
  if (!is_supported_bits(bits)) {
    throw InvalidInput("unsupported bit width (akv packs 2, 3, 4 or 8 bits)",
                       {"", field, std::to_string(bits)});
  }
}

std::size_t packed_size(std::size_t n_codes, int bits) {
  return (n_codes * static_cast<std::size_t>(bits) + 7) / 8;
}

void pack_codes_ref(const std::uint8_t* codes, std::size_t n, int bits, std::uint8_t* out) {
  if (n == 0) return;  // empty buffers may be null
  std::memset(out, 0, packed_size(n, bits));
  for (std::size_t i = 0; i < n; ++i) {
    for (int b = 0; b < bits; ++b) {
      if ((codes[i] >> b) & 1u) {
        const std::size_t bit = i * static_cast<std::size_t>(bits) + static_cast<std::size_t>(b);
        out[bit / 8] = static_cast<std::uint8_t>(out[bit / 8] | (1u << (bit % 8)));
      }
    }
  }
}

void unpack_codes_ref(const std::uint8_t* in, std::size_t n, int bits, std::uint8_t* codes) {
  for (std::size_t i = 0; i < n; ++i) {
    unsigned c = 0;
    for (int b = 0; b < bits; ++b) {
      const std::size_t bit = i * static_cast<std::size_t>(bits) + static_cast<std::size_t>(b);
      c |= ((in[bit / 8] >> (bit % 8)) & 1u) << b;
    }
    codes[i] = static_cast<std::uint8_t>(c);
  }
}

// Whole units (codes that fill whole bytes) run the specialised loops; the tail starts on a
// byte boundary, so the reference on the rest gives the same stream.
void pack_codes(const std::uint8_t* c, std::size_t n, int bits, std::uint8_t* out) {
  if (n == 0) return;  // empty buffers may be null
  std::size_t i = 0, o = 0;
  switch (bits) {
    case 8:
      std::memcpy(out, c, n);
      return;
    case 4:
      for (; i + 2 <= n; i += 2) out[o++] = static_cast<std::uint8_t>(c[i] | (c[i + 1] << 4));
      break;
    case 2:
      for (; i + 4 <= n; i += 4) {
        out[o++] = static_cast<std::uint8_t>(c[i] | (c[i + 1] << 2) | (c[i + 2] << 4) |
                                             (c[i + 3] << 6));
      }
      break;
    case 3:
      for (; i + 8 <= n; i += 8) {
        std::uint32_t w = 0;
        for (int k = 0; k < 8; ++k) w |= static_cast<std::uint32_t>(c[i + k]) << (3 * k);
        out[o] = static_cast<std::uint8_t>(w);
        out[o + 1] = static_cast<std::uint8_t>(w >> 8);
        out[o + 2] = static_cast<std::uint8_t>(w >> 16);
        o += 3;
      }
      break;
    default: check_bits(bits, "bits");
  }
  pack_codes_ref(c + i, n - i, bits, out + o);
}

void unpack_codes(const std::uint8_t* in, std::size_t n, int bits, std::uint8_t* c) {
  if (n == 0) return;  // empty buffers may be null
  std::size_t i = 0, o = 0;
  switch (bits) {
    case 8:
      std::memcpy(c, in, n);
      return;
    case 4:
      for (; i + 2 <= n; i += 2, ++o) {
        c[i] = in[o] & 0x0fu;
        c[i + 1] = static_cast<std::uint8_t>(in[o] >> 4);
      }
      break;
    case 2:
      for (; i + 4 <= n; i += 4, ++o) {
        c[i] = in[o] & 3u;
        c[i + 1] = (in[o] >> 2) & 3u;
        c[i + 2] = (in[o] >> 4) & 3u;
        c[i + 3] = static_cast<std::uint8_t>(in[o] >> 6);
      }
      break;
    case 3:
      for (; i + 8 <= n; i += 8, o += 3) {
        const std::uint32_t w = in[o] | (static_cast<std::uint32_t>(in[o + 1]) << 8) |
                                (static_cast<std::uint32_t>(in[o + 2]) << 16);
        for (int k = 0; k < 8; ++k) c[i + k] = static_cast<std::uint8_t>((w >> (3 * k)) & 7u);
      }
      break;
    default: check_bits(bits, "bits");
  }
  unpack_codes_ref(in + o, n - i, bits, c + i);
}

}  // namespace akv
