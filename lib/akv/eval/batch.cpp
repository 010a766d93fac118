#include "akv/eval/batch.h"

#include <algorithm>

#include "akv/core/errors.h"

namespace akv {

std::size_t resolve_batch(std::size_t batch, std::size_t n_sequences, std::size_t lanes_per_sequence,
                          const KvShape& shape, std::size_t max_tokens) {
  const std::size_t n = std::max<std::size_t>(n_sequences, 1);
  if (batch == 0) return n;
  if (batch != kBatchAuto) return std::min(batch, n);
  const std::uint64_t lane_bytes = std::uint64_t{2} * sizeof(float) * shape.n_layers * shape.n_kv_heads *
                                   shape.head_dim * std::max<std::size_t>(max_tokens, 1);
  const std::uint64_t per_sequence = lane_bytes * std::max<std::size_t>(lanes_per_sequence, 1);
  const std::uint64_t fit = per_sequence ? kBatchMemory / per_sequence : n;
  return static_cast<std::size_t>(std::clamp<std::uint64_t>(fit, 1, n));
}

std::size_t resolve_token_block(std::size_t block, std::size_t lanes, std::size_t vocab) {
  if (block != 0) return block;
  const std::size_t n = std::max<std::size_t>(lanes, 1);
  const std::uint64_t row = std::uint64_t{4} * std::max<std::size_t>(vocab, 1) * n;
  const std::uint64_t rows = (kTokenBlockRows + n - 1) / n;
  return static_cast<std::size_t>(std::clamp<std::uint64_t>(std::min(rows, kTokenBlockMemory / row), 1, kTokenBlockMax));
}

namespace {

// A plain decimal count (digits only) at most max; false otherwise.
bool parse_count(const std::string& text, unsigned long long max, std::size_t& out) {
  std::size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  if (text.empty() || used != text.size() || text[0] == '-' || text[0] == '+' || v > max) return false;
  out = static_cast<std::size_t>(v);
  return true;
}

}  // namespace

std::size_t parse_batch(const std::string& text) {
  if (text == "auto") return kBatchAuto;
  std::size_t v = 0;
  if (!parse_count(text, kBatchAuto - 1, v)) {
    throw InvalidInput("batch must be auto or a count of sequences (0 = all)", {"", "--batch", text});
  }
  return v;
}

std::size_t parse_token_block(const std::string& text) {
  if (text == "auto") return 0;
  std::size_t v = 0;
  if (!parse_count(text, kTokenBlockFlagMax, v)) {
    throw InvalidInput("token block must be auto (or 0) or a count of tokens up to " + std::to_string(kTokenBlockFlagMax),
                       {"", "--token-block", text});
  }
  return v;
}

}  // namespace akv
