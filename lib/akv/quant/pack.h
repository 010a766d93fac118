#pragma once
// Dense bit packing of b-bit codes, b in {2, 3, 4, 8}.
// Stream layout: code i occupies bits [i*b, (i+1)*b) of a little-endian bit stream (bit 0 is the
// least significant bit of byte 0). 3-bit codes cross byte boundaries: 8 codes fill 3 bytes.
// The last byte's unused high bits are zero.
#include <cstddef>
#include <cstdint>

namespace akv {

bool is_supported_bits(int bits);                        // 2, 3, 4 or 8
void check_bits(int bits, const char* field);            // throws InvalidInput naming field
std::size_t packed_size(std::size_t n_codes, int bits);  // ceil(n * bits / 8)

// Reference: one bit at a time. Codes must be < 2^bits.
void pack_codes_ref(const std::uint8_t* codes, std::size_t n, int bits, std::uint8_t* out);
void unpack_codes_ref(const std::uint8_t* in, std::size_t n, int bits, std::uint8_t* codes);

// Fast paths, bit-identical to the reference.
void pack_codes(const std::uint8_t* codes, std::size_t n, int bits, std::uint8_t* out);
void unpack_codes(const std::uint8_t* in, std::size_t n, int bits, std::uint8_t* codes);

}  // namespace akv
