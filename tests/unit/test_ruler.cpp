// RULER task generation, checked by brute force on the decoded prompts (byte tokenizer: tokens
// are bytes, so a prompt's text is its tokens): lengths, determinism, the needles and the
// reference answers, the counts behind cwe and fwe, and the scoring rule.
#include <catch2/catch.hpp>

#include <map>
#include <sstream>

#include "akv/core/errors.h"
#include "akv/eval/ruler_tasks.h"
#include "akv/eval/ruler_words.h"

using namespace akv;

namespace {

std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string between(const std::string& text, const std::string& from, const std::string& to) {
  const std::size_t a = text.find(from);
  REQUIRE(a != std::string::npos);
  const std::size_t b = text.find(to, a + from.size());
  REQUIRE(b != std::string::npos);
  return text.substr(a + from.size(), b - a - from.size());
}

}  // namespace

TEST_CASE("ruler: every task fills its length, deterministically, BOS first", "[eval][ruler]") {
  const Tokenizer tok = Tokenizer::bytes();
  for (const RulerTask& t : ruler_tasks()) {
    for (std::size_t length : {2048u, 5000u}) {
      const RulerSample a = make_ruler_sample(tok, t, length, 3, 7, AnswerPrefix::ruler);
      const RulerSample b = make_ruler_sample(tok, t, length, 3, 7, AnswerPrefix::ruler);
      const RulerSample c = make_ruler_sample(tok, t, length, 4, 7, AnswerPrefix::ruler);
      INFO(t.name << " at " << length);
      CHECK(a.tokens == b.tokens);
      CHECK(a.expected == b.expected);
      CHECK(a.tokens != c.tokens);
      CHECK(a.tokens.size() <= length);
      // The haystack is as long as fits: within one sentence (or list item) of the length.
      CHECK(a.tokens.size() + 200 > length);
      CHECK(a.tokens[0] == tok.bos());
      CHECK(!a.expected.empty());
    }
  }
}

TEST_CASE("ruler: needle tasks hold each asked value once, under its key", "[eval][ruler]") {
  const Tokenizer tok = Tokenizer::bytes();
  for (const char* name : {"niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
                           "niah_multikey_3", "niah_multivalue", "niah_multiquery"}) {
    const RulerTask& t = ruler_task(name);
    const RulerSample s = make_ruler_sample(tok, t, 4096, 0, 1, AnswerPrefix::restate);
    const std::string text = tok.decode(s.tokens);
    INFO(name << ": " << text.substr(text.size() - 200));
    const std::size_t n_expected = std::string(name) == "niah_multivalue" || std::string(name) == "niah_multiquery" ? 4 : 1;
    CHECK(s.expected.size() == n_expected);
    const bool uuids = std::string(name) == "niah_multikey_3";
    const std::string type = std::string(name) == "niah_single_3" || uuids ? "uuids" : "numbers";
    // restate: the prompt ends with the first asked key's needle words up to its value.
    const bool several_keys = std::string(name) == "niah_multiquery";
    const std::string key = between(text.substr(text.rfind("\nWhat ")), " for ", several_keys ? "," : " mentioned");
    const std::string needle_start = "One of the special magic " + type + " for " + key + " is:";
    CHECK(text.size() >= needle_start.size());
    CHECK(text.compare(text.size() - needle_start.size(), needle_start.size(), needle_start) == 0);
    // Every asked value is in the haystack exactly once, in a needle.
    for (const std::string& v : s.expected) {
      CHECK(occurrences(text, v) == 1);
      CHECK(occurrences(text, " is: " + v + ".") == 1);
    }
    // The first key's needle(s): its values (one per needle; multivalue's four).
    const std::size_t key_needles = occurrences(text, " for " + key + " is: ");
    CHECK(key_needles == (std::string(name) == "niah_multivalue" ? 4u : 1u));
    if (std::string(name).rfind("niah_multikey_2", 0) == 0 || uuids) CHECK(occurrences(text, "One of the special magic") > 20);
    CHECK(tok.decode({s.tokens.begin() + static_cast<std::ptrdiff_t>(s.needle_pos), s.tokens.end()}).rfind(" One of", 0) == 0);
  }
}

TEST_CASE("ruler: answer prefixes", "[eval][ruler]") {
  const Tokenizer tok = Tokenizer::bytes();
  const std::string single = tok.decode(make_ruler_sample(tok, ruler_task("niah_single_2"), 1024, 0, 1, AnswerPrefix::ruler).tokens);
  CHECK(single.rfind("A special magic number is hidden", 0) == 0);  // BOS decodes to nothing
  const std::string k = between(single.substr(single.rfind("\nWhat ")), " for ", " mentioned");
  const std::string end = " The special magic number for " + k + " mentioned in the provided text is";
  CHECK(single.compare(single.size() - end.size(), end.size(), end) == 0);
  const std::string multi = tok.decode(make_ruler_sample(tok, ruler_task("niah_multiquery"), 1024, 0, 1, AnswerPrefix::ruler).tokens);
  const std::string keys = between(multi.substr(multi.rfind("\nWhat ")), "What are all the special magic numbers for ", " mentioned");
  CHECK(occurrences(keys, ", ") == 3);
  CHECK(occurrences(keys, ", and ") == 1);
  const std::string multi_end = " The special magic numbers for " + keys + " mentioned in the provided text are";
  CHECK(multi.compare(multi.size() - multi_end.size(), multi_end.size(), multi_end) == 0);
  CHECK_THROWS_AS(parse_answer_prefix("verbatim"), InvalidInput);
}

TEST_CASE("ruler: vt's chain leads from the value to every variable", "[eval][ruler]") {
  const Tokenizer tok = Tokenizer::bytes();
  const RulerSample s = make_ruler_sample(tok, ruler_task("vt"), 3000, 2, 1, AnswerPrefix::ruler);
  const std::string text = tok.decode(s.tokens);
  const std::string value = between(text, "assigned the value ", " in the text");
  // Follow the assignments as written, in text order.
  std::map<std::string, std::string> holds;  // variable -> value
  std::istringstream in(text);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  for (std::size_t i = 0; i + 3 < w.size(); ++i) {
    if (w[i] != "VAR" || w[i + 2] != "=") continue;
    std::string rhs = w[i + 3];
    if (rhs == "VAR") rhs = holds[w[i + 4].substr(0, w[i + 4].size() - 1)];
    else rhs = rhs.substr(0, rhs.size() - 1);
    holds[w[i + 1]] = rhs;
  }
  std::vector<std::string> found;
  for (const auto& [var, v] : holds) {
    if (v == value) found.push_back(var);
  }
  std::vector<std::string> expected = s.expected;
  std::sort(expected.begin(), expected.end());
  CHECK(found == expected);
  CHECK(expected.size() == 5);
}

TEST_CASE("ruler: cwe's references are the ten most repeated words", "[eval][ruler]") {
  const Tokenizer tok = Tokenizer::bytes();
  for (std::size_t length : {2000u, 8000u}) {
    const RulerSample s = make_ruler_sample(tok, ruler_task("cwe"), length, 1, 1, AnswerPrefix::ruler);
    const std::string list = between(tok.decode(s.tokens), "appear most often.\n", "\nQuestion:");
    std::map<std::string, std::size_t> count;
    std::istringstream in(list);
    std::size_t item = 0;
    for (std::string number, word; in >> number >> word;) {
      CHECK(number == std::to_string(++item) + ".");
      ++count[word];
    }
    const std::size_t common = length < 4096 ? 6 : 30, rare = length < 4096 ? 1 : 3;
    CHECK(s.expected.size() == 10);
    for (const std::string& w : s.expected) CHECK(count[w] == common);
    std::size_t others = 0;
    for (const auto& [w, n] : count) {
      if (std::find(s.expected.begin(), s.expected.end(), w) == s.expected.end()) {
        CHECK(n == rare);
        ++others;
      }
    }
    CHECK(others > 10);
  }
}

TEST_CASE("ruler: fwe's references are the three most frequent coded words", "[eval][ruler]") {
  const Tokenizer tok = Tokenizer::bytes();
  const RulerSample s = make_ruler_sample(tok, ruler_task("fwe"), 6000, 0, 1, AnswerPrefix::ruler);
  const std::string text = between(tok.decode(s.tokens), "coded words.", "\nQuestion:");
  std::map<std::string, std::size_t> count;
  std::istringstream in(text);
  for (std::string w; in >> w;) ++count[w];
  std::vector<std::pair<std::size_t, std::string>> ranked;
  for (const auto& [w, n] : count) {
    if (w != "....") ranked.emplace_back(n, w);
  }
  std::sort(ranked.rbegin(), ranked.rend());
  REQUIRE(ranked.size() > 4);
  CHECK(count["...."] > ranked[0].first);  // the noise word is the most frequent
  CHECK(ranked[2].first > ranked[3].first);
  std::vector<std::string> top{ranked[0].second, ranked[1].second, ranked[2].second};
  CHECK(top == s.expected);
}

TEST_CASE("ruler: lengths too short and unknown tasks are refused by name", "[eval][ruler]") {
  const Tokenizer tok = Tokenizer::bytes();
  for (const RulerTask& t : ruler_tasks()) {
    CHECK_THROWS_AS(make_ruler_sample(tok, t, 100, 0, 1, AnswerPrefix::ruler), InvalidInput);
  }
  CHECK_THROWS_WITH(ruler_task("qa_1"), Catch::Contains("--tasks") && Catch::Contains("qa_1"));
}

TEST_CASE("ruler: string_match_all by hand", "[eval][ruler]") {
  CHECK(ruler_score(" 1234567. The grass", {"1234567"}) == 1.0);
  CHECK(ruler_score("Answer: ALPHA and gamma", {"alpha", "beta", "Gamma", "delta"}) == 0.5);
  CHECK(ruler_score("", {"x"}) == 0.0);
  CHECK(ruler_score("anything", {}) == 0.0);
}

TEST_CASE("ruler: word lists hold no duplicates", "[eval][ruler]") {
  for (const auto* list : {&ruler_words::adjectives(), &ruler_words::nouns(), &ruler_words::verbs(), &ruler_words::adverbs()}) {
    std::vector<std::string> v = *list;
    std::sort(v.begin(), v.end());
    CHECK(std::adjacent_find(v.begin(), v.end()) == v.end());
    CHECK(v.size() >= 20);
  }
}

TEST_CASE("ruler: needle depths move the same needles through the same haystack", "[eval][ruler]") {
  const Tokenizer tok = Tokenizer::bytes();
  for (const char* name : {"niah_single_2", "niah_multikey_2", "niah_multivalue"}) {
    const RulerTask& t = ruler_task(name);
    const RulerSample random = make_ruler_sample(tok, t, 2048, 5, 1, AnswerPrefix::ruler);
    INFO(name);
    std::vector<std::int32_t> sorted_random = random.tokens;
    std::sort(sorted_random.begin(), sorted_random.end());
    std::size_t last_pos = 0;
    for (double depth : {0.0, 0.3, 1.0}) {
      const RulerSample s = make_ruler_sample(tok, t, 2048, 5, 1, AnswerPrefix::ruler, depth);
      INFO("depth " << depth);
      // The same pieces (the same expected values, the same tokens in another order).
      CHECK(s.expected == random.expected);
      std::vector<std::int32_t> sorted = s.tokens;
      std::sort(sorted.begin(), sorted.end());
      CHECK(sorted == sorted_random);
      // The needles sit at the depth: at 0 the first needle (an asked one) follows the head, at 1
      // the last one before the question is asked.
      const std::string text = tok.decode(s.tokens);
      const std::size_t first = text.find(" One of the special magic"), question = text.find("\nWhat ");
      REQUIRE(first != std::string::npos);
      const auto value_at = [&](std::size_t from) { return text.substr(from + 5, text.find('.', from) - from - 5); };
      const auto asked = [&](const std::string& v) { return std::count(s.expected.begin(), s.expected.end(), v) == 1; };
      if (depth == 0.0) {
        CHECK(text.substr(first - 12, 12) == "afterwards.\n");
        CHECK(asked(value_at(text.find(" is: ", first))));
      }
      if (depth == 1.0) {
        const std::size_t last = text.rfind(" is: ", question);
        CHECK(text.find('.', last) + 1 == question);
        CHECK(asked(value_at(last)));
      }
      CHECK(s.needle_pos >= last_pos);
      last_pos = s.needle_pos;
    }
  }
  CHECK_THROWS_AS(make_ruler_sample(tok, ruler_task("vt"), 2048, 0, 1, AnswerPrefix::ruler, 0.5), InvalidInput);
  CHECK_THROWS_AS(make_ruler_sample(tok, ruler_task("niah_single_1"), 2048, 0, 1, AnswerPrefix::ruler, 1.5), InvalidInput);
}
