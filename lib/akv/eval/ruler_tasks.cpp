#include "akv/eval/ruler_tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <set>

#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "akv/eval/ruler_words.h"

namespace akv {
namespace {

// RULER's configuration of a needle task (synthetic.yaml).
struct NeedleTask {
  const char* haystack;  // noise | essay | needle
  const char* key;       // words | uuids
  const char* value;     // numbers | uuids
  std::size_t keys, values, queries;
};

const NeedleTask* needle_task(const std::string& name) {
  static const std::vector<std::pair<std::string, NeedleTask>> table = {
      {"niah_single_1", {"noise", "words", "numbers", 1, 1, 1}},
      {"niah_single_2", {"essay", "words", "numbers", 1, 1, 1}},
      {"niah_single_3", {"essay", "words", "uuids", 1, 1, 1}},
      {"niah_multikey_1", {"essay", "words", "numbers", 4, 1, 1}},
      {"niah_multikey_2", {"needle", "words", "numbers", 1, 1, 1}},
      {"niah_multikey_3", {"needle", "uuids", "uuids", 1, 1, 1}},
      {"niah_multivalue", {"essay", "words", "numbers", 1, 4, 1}},
      {"niah_multiquery", {"essay", "words", "numbers", 4, 1, 4}},
  };
  for (const auto& [n, t] : table) {
    if (n == name) return &t;
  }
  return nullptr;
}

constexpr const char* kNoise = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

const std::string& pick(Rng& rng, const std::vector<std::string>& v) { return v[rng.below(v.size())]; }

std::string number7(Rng& rng) { return std::to_string(1000000 + rng.below(9000000)); }

std::string uuid4(Rng& rng) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) {
    std::uint64_t d = rng.below(16);
    if (i == 12) d = 4;                    // version 4
    if (i == 16) d = 8 + (d & 3);          // variant 10xx
    if (i == 8 || i == 12 || i == 16 || i == 20) s += '-';
    s += hex[d];
  }
  return s;
}

std::string word_key(Rng& rng) { return pick(rng, ruler_words::adjectives()) + "-" + pick(rng, ruler_words::nouns()); }

std::string capitalized(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

// One sentence of the generated essay haystack (leading space).
std::string essay_sentence(Rng& rng) {
  using namespace ruler_words;
  const std::string a1 = pick(rng, adjectives()), n1 = pick(rng, nouns()), v = pick(rng, verbs());
  const std::string a2 = pick(rng, adjectives()), n2 = pick(rng, nouns()), adv = pick(rng, adverbs());
  switch (rng.below(4)) {
    case 0: return fmt::format(" The {} {} {} the {} {}.", a1, n1, v, a2, n2);
    case 1: return fmt::format(" {} the {} {} the {}.", capitalized(adv), n1, v, n2);
    case 2: return fmt::format(" A {} {} {} a {} {} {}.", a1, n1, v, a2, n2, adv);
    default: return fmt::format(" Every {} near the {} {} was {}.", n1, a2, n2, a1);
  }
}

// A prompt assembled from separately tokenized pieces.
class Pieces {
 public:
  Pieces(const Tokenizer& tok, std::size_t length) : tok_(tok), length_(length) {}
  std::vector<std::int32_t> encode(const std::string& text) const { return tok_.encode(text); }
  // Tokens that head + tail + extras take, BOS included; InvalidInput naming --lengths when
  // they leave no room.
  std::size_t room(const std::vector<std::int32_t>& head, const std::vector<std::int32_t>& tail, std::size_t extras,
                   const std::string& task) const {
    const std::size_t fixed = (tok_.bos() >= 0 ? 1 : 0) + head.size() + tail.size() + extras;
    if (fixed >= length_) {
      throw InvalidInput(fmt::format("ruler task {} needs more than {} prompt tokens", task, fixed),
                         {"", "--lengths", std::to_string(length_)});
    }
    return length_ - fixed;
  }
  std::vector<std::int32_t> start() const {
    std::vector<std::int32_t> t;
    if (tok_.bos() >= 0) t.push_back(tok_.bos());
    return t;
  }

 private:
  const Tokenizer& tok_;
  std::size_t length_;
};

void append(std::vector<std::int32_t>& to, const std::vector<std::int32_t>& from) { to.insert(to.end(), from.begin(), from.end()); }

// head, the haystack segments that fit with the inserts placed among them at uniform random
// boundaries (in order), or all at the boundary nearest to depth x segments, tail.
RulerSample haystack_prompt(const Pieces& p, const std::string& task, const std::string& head, const std::string& tail,
                            const std::vector<std::string>& inserts, const std::function<std::string()>& segment,
                            Rng& rng, std::vector<std::string> expected, std::optional<double> depth = std::nullopt) {
  const auto h = p.encode(head), t = p.encode(tail);
  std::vector<std::vector<std::int32_t>> ins;
  std::size_t ins_tokens = 0;
  for (const auto& s : inserts) {
    ins.push_back(p.encode(s));
    ins_tokens += ins.back().size();
  }
  const std::size_t room = p.room(h, t, ins_tokens, task);
  std::vector<std::vector<std::int32_t>> segs;
  for (std::size_t used = 0;;) {
    auto s = p.encode(segment());
    if (s.empty() || used + s.size() > room) break;
    used += s.size();
    segs.push_back(std::move(s));
  }
  std::vector<std::size_t> at(ins.size());
  if (depth) {
    at.assign(ins.size(), static_cast<std::size_t>(std::llround(*depth * static_cast<double>(segs.size()))));
  } else {
    for (auto& a : at) a = rng.below(segs.size() + 1);
    std::sort(at.begin(), at.end());
  }
  RulerSample out;
  out.tokens = p.start();
  append(out.tokens, h);
  std::size_t next = 0;
  for (std::size_t i = 0; i <= segs.size(); ++i) {
    for (; next < ins.size() && at[next] == i; ++next) {
      if (next == 0) out.needle_pos = out.tokens.size();
      append(out.tokens, ins[next]);
    }
    if (i < segs.size()) append(out.tokens, segs[i]);
  }
  out.question_pos = out.tokens.size();
  append(out.tokens, t);
  out.expected = std::move(expected);
  return out;
}

RulerSample needle_sample(const Pieces& p, const std::string& name, const NeedleTask& t, Rng& rng, AnswerPrefix prefix,
                          std::optional<double> depth) {
  const std::string type = t.value;  // "numbers" / "uuids"
  const std::string one = type.substr(0, type.size() - 1);
  auto key = [&] { return std::string(t.key) == "uuids" ? uuid4(rng) : word_key(rng); };
  auto value = [&] { return std::string(t.value) == "uuids" ? uuid4(rng) : number7(rng); };
  auto needle = [&](const std::string& k, const std::string& v) {
    return fmt::format(" One of the special magic {} for {} is: {}.", type, k, v);
  };
  std::set<std::string> used;
  std::vector<std::string> keys;
  while (keys.size() < t.keys) {
    std::string k = key();
    if (used.insert(k).second) keys.push_back(k);
  }
  std::vector<std::string> needles, expected;
  for (std::size_t k = 0; k < keys.size(); ++k) {
    for (std::size_t v = 0; v < t.values; ++v) {
      const std::string val = value();
      needles.push_back(needle(keys[k], val));
      if (k < t.queries) expected.push_back(val);
    }
  }
  for (std::size_t i = needles.size(); i > 1; --i) std::swap(needles[i - 1], needles[rng.below(i)]);  // RULER shuffles them
  std::string query = keys[0];
  for (std::size_t q = 1; q < t.queries; ++q) query += (q + 1 == t.queries ? ", and " : ", ") + keys[q];
  const bool single = t.values * t.queries == 1;
  const std::string head =
      single ? fmt::format("A special magic {0} is hidden within the following text. Make sure to memorize it. I will "
                           "quiz you about the {0} afterwards.\n",
                           one)
             : fmt::format("Some special magic {0} are hidden within the following text. Make sure to memorize it. I "
                           "will quiz you about the {0} afterwards.\n",
                           type);
  std::string tail =
      single ? fmt::format("\nWhat is the special magic {0} for {1} mentioned in the provided text?", one, query)
             : fmt::format("\nWhat are all the special magic {0} for {1} mentioned in the provided text?", type, query);
  if (prefix == AnswerPrefix::restate) {
    tail += fmt::format(" One of the special magic {} for {} is:", type, keys[0]);
  } else {
    tail += single ? fmt::format(" The special magic {} for {} mentioned in the provided text is", one, query)
                   : fmt::format(" The special magic {} for {} mentioned in the provided text are", type, query);
  }
  std::function<std::string()> segment;
  if (std::string(t.haystack) == "noise") {
    segment = [] { return std::string(kNoise); };
  } else if (std::string(t.haystack) == "essay") {
    segment = [&rng] { return essay_sentence(rng); };
  } else {  // distractor needles, every key new
    segment = [&] {
      for (std::size_t tries = 0; tries < 1000; ++tries) {
        std::string k = key();
        if (used.insert(k).second) return needle(k, value());
      }
      return std::string();  // the key space is exhausted: the haystack ends here
    };
  }
  return haystack_prompt(p, name, head, tail, needles, segment, rng, expected, depth);
}

RulerSample vt_sample(const Pieces& p, Rng& rng) {
  constexpr std::size_t kHops = 4;  // one chain of 5 variables (RULER's num_chains 1, num_hops 4)
  std::set<std::string> seen;
  std::vector<std::string> vars;
  while (vars.size() < kHops + 1) {
    std::string v;
    for (int i = 0; i < 5; ++i) v += static_cast<char>('A' + rng.below(26));
    if (seen.insert(v).second) vars.push_back(v);
  }
  const std::string value = std::to_string(10000 + rng.below(89999));
  std::vector<std::string> chain{fmt::format(" VAR {} = {}.", vars[0], value)};
  for (std::size_t j = 0; j < kHops; ++j) chain.push_back(fmt::format(" VAR {} = VAR {}.", vars[j + 1], vars[j]));
  const std::string head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
  const std::string tail = fmt::format(
      "\nQuestion: Find all variables that are assigned the value {0} in the text above. Answer: According to the "
      "chain(s) of variable assignment in the text above, {1} variables are assigned the value {0}, they are: ",
      value, kHops + 1);
  return haystack_prompt(p, "vt", head, tail, chain, [] { return std::string(kNoise); }, rng, vars);
}

// cwe's words: the lists, then adjective+noun compounds, in a seeded order.
std::vector<std::string> cwe_words(Rng& rng, std::size_t n) {
  using namespace ruler_words;
  std::set<std::string> seen;
  std::vector<std::string> pool;
  for (const auto* list : {&nouns(), &adjectives(), &verbs(), &adverbs()}) {
    for (const auto& w : *list) {
      if (seen.insert(w).second) pool.push_back(w);
    }
  }
  const std::size_t base = pool.size();
  if (n > base) {
    for (const auto& a : adjectives()) {
      for (const auto& b : nouns()) {
        if (seen.insert(a + b).second) pool.push_back(a + b);
      }
    }
  }
  if (n > pool.size()) return {};
  // A partial Fisher-Yates: the first n of a seeded permutation (the lists first while they suffice).
  const std::size_t span = n > base ? pool.size() : base;
  for (std::size_t i = 0; i < n; ++i) std::swap(pool[i], pool[i + rng.below(span - i)]);
  pool.resize(n);
  return pool;
}

RulerSample cwe_sample(const Pieces& p, std::size_t length, Rng& rng) {
  constexpr std::size_t kCommon = 10;
  // RULER: 30 and 3 repeats from 4096 tokens on, 6 and 1 below.
  const std::size_t rep_common = length < 4096 ? 6 : 30, rep_rare = length < 4096 ? 1 : 3;
  const std::string head =
      "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that "
      "appear most often.\n";
  const std::string tail = fmt::format(
      "\nQuestion: What are the {0} most common words in the above list? Answer: The top {0} words that appear most "
      "often in the list are:",
      kCommon);
  const auto h = p.encode(head), t = p.encode(tail);
  const std::size_t room = p.room(h, t, 0, "cwe");
  const std::uint64_t list_seed = rng.next();
  // The list of n words (kCommon common), shuffled, and its tokens.
  auto build = [&](std::size_t n, std::vector<std::string>* common) {
    Rng r(list_seed);
    const std::vector<std::string> words = cwe_words(r, n);
    std::vector<std::int32_t> tokens;
    if (words.empty()) return std::make_pair(false, tokens);
    std::vector<const std::string*> list;
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t k = 0; k < (i < kCommon ? rep_common : rep_rare); ++k) list.push_back(&words[i]);
    }
    for (std::size_t i = list.size(); i > 1; --i) std::swap(list[i - 1], list[r.below(i)]);
    for (std::size_t i = 0; i < list.size() && tokens.size() <= room; ++i) {
      append(tokens, p.encode(fmt::format("{}{}. {}", i ? " " : "", i + 1, *list[i])));
    }
    if (common) common->assign(words.begin(), words.begin() + kCommon);
    return std::make_pair(tokens.size() <= room, tokens);
  };
  if (!build(kCommon + 1, nullptr).first) {
    throw InvalidInput("ruler task cwe: the word list does not fit the prompt", {"", "--lengths", std::to_string(length)});
  }
  std::size_t lo = kCommon + 1, hi = kCommon + 2;  // the largest n that fits, in [lo, hi)
  while (build(hi, nullptr).first) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    (build(mid, nullptr).first ? lo : hi) = mid;
  }
  RulerSample out;
  std::vector<std::string> common;
  const auto list = build(lo, &common).second;
  out.tokens = p.start();
  append(out.tokens, h);
  out.needle_pos = out.tokens.size();
  append(out.tokens, list);
  out.question_pos = out.tokens.size();
  append(out.tokens, t);
  out.expected = common;
  return out;
}

RulerSample fwe_sample(const Pieces& p, std::size_t length, Rng& rng) {
  constexpr std::size_t kVocab = 2000;
  constexpr double kAlpha = 2.0, kZeta2 = 1.6449340668482264;  // zeta(alpha)
  std::set<std::string> seen;
  std::vector<std::string> vocab;
  while (vocab.size() < kVocab) {
    std::string w;
    for (int i = 0; i < 6; ++i) w += static_cast<char>('a' + rng.below(26));
    if (seen.insert(w).second) vocab.push_back(w);
  }
  vocab[0] = "....";  // RULER: the top-ranked word is noise
  const std::string head =
      "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
      "appeared coded words.";
  const std::string tail =
      "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently "
      "appeared words in the above coded text? Answer: According to the coded text above, the three most frequently "
      "appeared words are:";
  const auto h = p.encode(head), t = p.encode(tail);
  const std::size_t room = p.room(h, t, 0, "fwe");
  std::vector<std::size_t> word_tokens(kVocab);
  for (std::size_t k = 0; k < kVocab; ++k) word_tokens[k] = p.encode(" " + vocab[k]).size();
  // RULER's counts: word of rank k appears floor(n k^-alpha / zeta(alpha)) times.
  auto count = [&](std::size_t n, std::size_t k) {
    return static_cast<std::size_t>(std::floor(static_cast<double>(n) * std::pow(static_cast<double>(k + 1), -kAlpha) / kZeta2));
  };
  auto tokens = [&](std::size_t n) {
    std::size_t s = 0;
    for (std::size_t k = 0; k < kVocab; ++k) s += count(n, k) * word_tokens[k];
    return s;
  };
  constexpr std::size_t kLeast = 27;  // the least n at which the fourth word appears: 27 / 16 / zeta(2) >= 1
  if (tokens(kLeast) > room) {
    throw InvalidInput("ruler task fwe: the coded text does not fit the prompt", {"", "--lengths", std::to_string(length)});
  }
  std::size_t lo = kLeast, hi = 2 * kLeast;
  while (tokens(hi) <= room) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    (tokens(mid) <= room ? lo : hi) = mid;
  }
  std::vector<std::size_t> words;
  for (std::size_t k = 0; k < kVocab; ++k) words.insert(words.end(), count(lo, k), k);
  for (std::size_t i = words.size(); i > 1; --i) std::swap(words[i - 1], words[rng.below(i)]);
  RulerSample out;
  out.tokens = p.start();
  append(out.tokens, h);
  out.needle_pos = out.tokens.size();
  for (std::size_t w : words) append(out.tokens, p.encode(" " + vocab[w]));
  out.question_pos = out.tokens.size();
  append(out.tokens, t);
  out.expected = {vocab[1], vocab[2], vocab[3]};
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

AnswerPrefix parse_answer_prefix(const std::string& text) {
  if (text == "ruler") return AnswerPrefix::ruler;
  if (text == "restate") return AnswerPrefix::restate;
  throw InvalidInput("answer prefix must be ruler or restate", {"", "--answer-prefix", text});
}

const char* answer_prefix_name(AnswerPrefix p) { return p == AnswerPrefix::ruler ? "ruler" : "restate"; }

const std::vector<RulerTask>& ruler_tasks() {
  static const std::vector<RulerTask> tasks = {
      {"niah_single_1", 128, "one needle; key word, value 7-digit number; repeated-sentence haystack"},
      {"niah_single_2", 128, "one needle; key word, value number; essay haystack"},
      {"niah_single_3", 128, "one needle; key word, value uuid; essay haystack"},
      {"niah_multikey_1", 128, "4 needles, 1 asked; key word, value number; essay haystack"},
      {"niah_multikey_2", 128, "1 needle among distractor needles (the haystack); key word, value number"},
      {"niah_multikey_3", 128, "1 needle among distractor needles (the haystack); key uuid, value uuid"},
      {"niah_multivalue", 128, "1 key with 4 values, all asked; essay haystack"},
      {"niah_multiquery", 128, "4 needles, all 4 asked; essay haystack"},
      {"vt", 30, "variable tracking: a chain of 5 variables (VAR B = VAR A) among noise; all 5 asked"},
      {"cwe", 120, "common words extraction: the 10 words repeated most in a numbered list"},
      {"fwe", 50, "frequent words extraction: the 3 most frequent coded words of a Zipf(2) text"},
  };
  return tasks;
}

const RulerTask& ruler_task(const std::string& name) {
  for (const RulerTask& t : ruler_tasks()) {
    if (t.name == name) return t;
  }
  throw InvalidInput("unknown ruler task (niah_single_1..3, niah_multikey_1..3, niah_multivalue, niah_multiquery, vt, cwe, fwe)",
                     {"", "--tasks", name});
}

bool ruler_task_has_depth(const std::string& task) { return needle_task(task) != nullptr; }

RulerSample make_ruler_sample(const Tokenizer& tok, const RulerTask& task, std::size_t length, std::size_t index,
                              std::uint64_t seed, AnswerPrefix prefix, std::optional<double> depth) {
  if (depth && !(*depth >= 0.0 && *depth <= 1.0)) throw InvalidInput("a depth outside [0, 1]", {"", "--depths", format_number(*depth)});
  if (depth && !needle_task(task.name)) {
    throw InvalidInput("depths place the needles of the niah_* tasks; this task has none", {"", "--tasks", task.name});
  }
  std::uint64_t name_hash = 1469598103934665603ull;  // FNV-1a of the task name
  for (unsigned char c : task.name) name_hash = (name_hash ^ c) * 1099511628211ull;
  Rng rng(stream_seed(seed, {name_hash, length, index}));
  const Pieces p(tok, length);
  if (const NeedleTask* t = needle_task(task.name)) return needle_sample(p, task.name, *t, rng, prefix, depth);
  if (task.name == "vt") return vt_sample(p, rng);
  if (task.name == "cwe") return cwe_sample(p, length, rng);
  return fwe_sample(p, length, rng);
}

double ruler_score(const std::string& answer, const std::vector<std::string>& expected) {
  if (expected.empty()) return 0.0;
  const std::string a = lower(answer);
  std::size_t found = 0;
  for (const std::string& e : expected) found += a.find(lower(e)) != std::string::npos ? 1 : 0;
  return static_cast<double>(found) / static_cast<double>(expected.size());
}

}  // namespace akv
