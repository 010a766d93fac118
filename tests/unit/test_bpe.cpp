#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/core/errors.h"
#include "akv/model/bpe_vocab.h"
#include "akv/model/tokenizer.h"
#include "test_util.h"

using namespace akv;

namespace {

const std::string kDir = std::string(AKV_SOURCE_DIR) + "/data/golden/bpe";

nlohmann::json golden() { return nlohmann::json::parse(std::ifstream(kDir + "/golden.json")); }

}  // namespace

TEST_CASE("tokenizer.json BPE (byte-level and SentencePiece-style): ids and decoded text equal Hugging Face tokenizers",
          "[bpe][tokenizer]") {
  const nlohmann::json g = golden();
  for (const std::string kind : {"llama3", "gpt2", "qwen2", "spm", "metaspace", "gemma"}) {
    const Tokenizer t(kDir + "/" + kind + "-tokenizer.json");
    const auto& cases = g["tokenizers"][kind]["cases"];
    REQUIRE(cases.size() == g["texts"].size());
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const std::string text = g["texts"][i].get<std::string>();
      const auto want = cases[i]["ids"].get<std::vector<std::int32_t>>();
      INFO(kind << " text " << i << ": " << text);
      CHECK(t.encode(text) == want);
      CHECK(t.decode(want) == cases[i]["decoded"].get<std::string>());
    }
    // The BOS the post-processor puts first (Llama 3, SentencePiece-style) or none (GPT-2, Qwen2).
    const auto with = g["tokenizers"][kind]["hello_with_specials"].get<std::vector<std::int32_t>>();
    const auto plain = t.encode("Hello world");
    CHECK(t.bos() == (with.size() > plain.size() ? with.front() : -1));
  }
}

TEST_CASE("tokenizer.json: what is not read is refused naming the field", "[bpe][tokenizer][bad]") {
  test::TempDir dir;
  const nlohmann::json base = nlohmann::json::parse(std::ifstream(kDir + "/llama3-tokenizer.json"));
  auto refused = [&](const std::string& name, nlohmann::json j, const std::string& message) {
    std::ofstream(dir.file(name)) << j.dump();
    INFO(name);
    CHECK_THROWS_WITH(Tokenizer(dir.file(name)), Catch::Contains(message));
  };
  nlohmann::json j = base;
  j["model"]["type"] = "Unigram";
  refused("unigram.json", j, "model.type = Unigram");
  j = base;
  j["model"]["byte_fallback"] = true;
  refused("spm.json", j, "needs the [Prepend +] Replace normalizer");
  // Gemma's layout: the Replace normalizer alone, then a Split at " " or nothing; a Split at a
  // regex, or the Replace normalizer on a byte-level vocabulary, is not read.
  const nlohmann::json gemma = nlohmann::json::parse(std::ifstream(kDir + "/gemma-tokenizer.json"));
  j = gemma;
  j["pre_tokenizer"]["pattern"] = {{"Regex", "\\s+"}};
  refused("gemma-regex.json", j, "pre_tokenizer = Split");
  j = gemma;
  j["pre_tokenizer"]["invert"] = true;
  refused("gemma-invert.json", j, "pre_tokenizer = Split");
  j = base;
  j["normalizer"] = gemma["normalizer"];
  refused("replace-bytelevel.json", j, "normalizer.type = Replace");
  j = gemma;
  j["pre_tokenizer"] = nullptr;
  CHECK(Tokenizer(kDir + "/gemma-tokenizer.json").encode("a  b\n\nc") ==
        (std::ofstream(dir.file("gemma-nopre.json")) << j.dump(), Tokenizer(dir.file("gemma-nopre.json")).encode("a  b\n\nc")));
  j = base;
  j["normalizer"] = {{"type", "Lowercase"}};
  refused("lower.json", j, "normalizer.type = Lowercase");
  j = base;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  refused("ws.json", j, "pre_tokenizer = Whitespace");
  j = base;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  refused("regex.json", j, "does not compile");
  j = base;
  j["added_tokens"][0]["id"] = 2000000000;
  refused("bigid.json", j, "added_tokens.id = 2000000000");
  j = base;
  j["model"]["vocab"]["zz"] = 1 << 30;
  refused("bigvocab.json", j, "token id out of range");
  j = base;
  j["model"]["vocab"]["zz"] = 1.6e28;  // a float id (fuzzing found it: converting it was undefined)
  refused("floatid.json", j, "model.vocab.zz");
  j = base;
  j["model"].erase("merges");
  refused("nomerges.json", j, "merges");
  CHECK_THROWS_WITH(Tokenizer(kDir + "/llama3-tokenizer.json").encode("ok \xff\xfe bytes"), Catch::Contains("invalid UTF-8"));
  std::ofstream(dir.file("broken.json")) << "{\"model\": ";
  CHECK_THROWS_AS(Tokenizer(dir.file("broken.json")), CorruptData);
  CHECK_THROWS_AS(Tokenizer(dir.file("missing.json")), IoError);
}

TEST_CASE("SentencePiece-style decode: <0xXX> pieces are bytes only when XX is two hex digits", "[bpe][tokenizer][bad]") {
  BpeVocab::Options o;
  o.byte_level = false;
  o.byte_fallback = true;
  // 0: <0x41>, 1: <0xZZ> (text, not a byte: it once ended in std::stoi's exception), 2: <0x-1>, 3: b
  const BpeVocab v({"<0x41>", "<0xZZ>", "<0x-1>", "b"}, {}, {}, o, "test");
  CHECK(v.decode({0, 3}) == "Ab");
  CHECK(v.decode({1}) == "<0xZZ>");
  CHECK(v.decode({2, 0}) == "<0x-1>A");
}

TEST_CASE("every tokenizer.json layout refuses text that is not UTF-8, naming the byte offset", "[bpe][tokenizer][bad]") {
  for (const char* name : {"gpt2", "llama3", "metaspace", "qwen2", "spm", "gemma"}) {
    const Tokenizer t(kDir + "/" + name + "-tokenizer.json");
    INFO(name);
    CHECK(!t.encode("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80").empty());  // valid 2-, 3- and 4-byte forms
    // A stray byte, an overlong '/', a UTF-16 surrogate, a code point past U+10FFFF, a cut sequence.
    for (const std::string bad : {"ok \xff", "ok \xC0\xAF", "ok \xED\xA0\x80", "ok \xF4\x90\x80\x80", "ok \xE2\x82"}) {
      CHECK_THROWS_WITH(t.encode(bad), Catch::Contains("invalid UTF-8 at byte offset 3"));
    }
  }
}
