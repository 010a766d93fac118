// Hugging Face tokenizer.json files (byte-level and SentencePiece-style BPE, bpe_vocab.h): the
// parse, then a few texts encoded and decoded (regexes from the file run in PCRE2).
#include "akv/model/tokenizer.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = akv::fuzz::write_input("tokenizer.json", data, size);
  akv::fuzz::expect_akv_errors([&] {
    const akv::Tokenizer t(path);
    for (const char* text : {"", "Hello world", "  x\n\ty \xC3\xA9\xE6\x97\xA5 <s></s>", "12345 it's"}) {
      const std::vector<std::int32_t> ids = t.encode(text);
      (void)t.decode(ids);
    }
    (void)t.bos();
    (void)t.vocab_size();
  });
  return 0;
}
