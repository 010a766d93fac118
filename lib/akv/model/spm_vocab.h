#pragma once
// A SentencePiece-style BPE vocabulary given as lists (GGUF's tokenizer.ggml.model "llama":
// tokens, scores, token types), encoded as llama.cpp does: the text is cut at user-defined pieces
// (type 4, longest first, each one id: Gemma's "\n\n" and runs of spaces; control pieces stay
// text, as llama-perplexity leaves them), then each part as SentencePiece's BPE model encodes it:
// a leading space (add_space_prefix; Gemma has none) and every space becomes U+2581; symbols
// start as UTF-8 characters; the adjacent pair whose concatenation is a normal piece with the highest score
// merges first (ties: the leftmost); symbols left without a piece become their UTF-8 bytes'
// <0xXX> pieces (byte fallback), or the unknown piece. Checked against libsentencepiece on the
// Llama 2 vocabulary and against llama.cpp on a Gemma-style one (tests/unit/test_gguf.cpp).
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace akv {

// SentencePiece's space, U+2581 (in UTF-8): what a space becomes in a piece.
inline constexpr const char* kSentencePieceSpace = "\xE2\x96\x81";

class SpmVocab {
 public:
  enum Type : std::int32_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };
  // InvalidInput (naming `where` and the field) when the lists disagree in length or a byte
  // piece is malformed.
  SpmVocab(std::vector<std::string> pieces, std::vector<float> scores, std::vector<std::int32_t> types,
           std::int32_t bos, std::int32_t unk, bool add_space_prefix, const std::string& where);

  std::vector<std::int32_t> encode(const std::string& text) const;  // no BOS / EOS
  std::string decode(const std::vector<std::int32_t>& ids) const;
  std::size_t size() const { return pieces_.size(); }
  std::int32_t bos() const { return bos_; }

 private:
  void encode_fragment(const std::string& text, std::vector<std::int32_t>& out) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<std::int32_t> types_;
  std::unordered_map<std::string, std::int32_t> normal_;  // mergeable pieces
  std::int32_t byte_id_[256];                            // <0xXX> pieces, -1 when absent
  std::vector<std::pair<std::string, std::int32_t>> user_;  // user-defined pieces, longest first
  bool user_start_[256] = {};                              // bytes a user-defined piece starts with
  std::int32_t bos_ = -1, unk_ = -1;
  bool add_space_prefix_ = true;
};

}  // namespace akv
