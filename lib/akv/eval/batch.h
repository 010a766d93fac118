#pragma once
// How many sequences (or passkey prompts) evaluate decodes together (`--batch`). The metrics do
// not depend on it; time and memory do: every (sequence, method) lane holds its own cache, and
// a bigger batch reads each weight matrix once per step for more lanes.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "akv/tensor/kv_shape.h"

namespace akv {

// `--batch auto` (the default): as many sequences as keep every lane's f32 K/V at the longest
// sequence's length within kBatchMemory (at least one sequence).
inline constexpr std::size_t kBatchAuto = std::numeric_limits<std::size_t>::max();
inline constexpr std::uint64_t kBatchMemory = std::uint64_t{2} << 30;

// The batch to use for n_sequences with lanes_per_sequence lanes each: batch 0 = all,
// kBatchAuto as above, otherwise min(batch, n_sequences); at least 1.
std::size_t resolve_batch(std::size_t batch, std::size_t n_sequences, std::size_t lanes_per_sequence,
                          const KvShape& shape, std::size_t max_tokens);

// "auto" or a count ("0" = all); InvalidInput naming --batch otherwise.
std::size_t parse_batch(const std::string& text);

// Teacher-forced tokens each lane decodes per model call (`--token-block`; Model::decode_lanes):
// the weights are read once per call and each lane's cache once per layer for all of them.
// 0 (auto): enough for about kTokenBlockRows rows per call (ceil(kTokenBlockRows / lanes)), at
// most kTokenBlockMax, fewer when the call's logits ([lanes x block, vocab] f32) would pass
// kTokenBlockMemory; at least 1. (More rows add little to the products' speed and spill the
// call's logits and caches out of the CPU caches: on the 58M llama of docs/model.md, 34 lanes
// ran 4-7% faster at 8 tokens than at 16.)
inline constexpr std::size_t kTokenBlockMax = 16;
inline constexpr std::size_t kTokenBlockRows = 256;
inline constexpr std::uint64_t kTokenBlockMemory = std::uint64_t{256} << 20;
std::size_t resolve_token_block(std::size_t block, std::size_t lanes, std::size_t vocab);
// "auto" (or 0) -> 0, else a count 1 .. kTokenBlockFlagMax; InvalidInput naming --token-block
// otherwise.
inline constexpr std::size_t kTokenBlockFlagMax = std::size_t{1} << 20;
std::size_t parse_token_block(const std::string& text);

}  // namespace akv
