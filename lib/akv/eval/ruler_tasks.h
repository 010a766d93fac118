#pragma once
// RULER's synthetic tasks (Hsieh et al. 2024, github.com/NVIDIA/RULER), generated with any
// tokenizer: the eight needle-in-a-haystack variants, variable tracking (vt), common words
// extraction (cwe) and frequent words extraction (fwe), with RULER's templates, needle format,
// counts and scoring. What differs from RULER (docs/ruler.md): the essay haystack is generated
// text (a small grammar over the project's word lists; RULER's Paul Graham essays cannot be
// shipped), keys are adjective-noun pairs from those lists (RULER draws them from wonderwords),
// cwe has no few-shot example, and fwe's coded words are separated by spaces only. The QA tasks
// (qa_1, qa_2) need SQuAD and HotpotQA and are not generated.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "akv/model/tokenizer.h"

namespace akv {

// How a needle task's prompt ends. ruler: RULER's answer prefix ("The special magic number for
// KEY mentioned in the provided text is"). restate: the needle's own words up to its value
// ("One of the special magic numbers for KEY is:"), for models that retrieve by matching the
// context verbatim, as the constructed retrieval model does (docs/retrieval_model.md); with
// several queries it restates the first. Other tasks always end with RULER's prefix.
enum class AnswerPrefix { ruler, restate };
AnswerPrefix parse_answer_prefix(const std::string& text);  // InvalidInput naming --answer-prefix
const char* answer_prefix_name(AnswerPrefix p);

struct RulerTask {
  std::string name;           // niah_single_1, ..., vt, cwe, fwe
  std::size_t answer_tokens;  // tokens RULER generates for it
  std::string summary;        // one line: haystack, keys, values
};
const std::vector<RulerTask>& ruler_tasks();     // the 11 tasks, RULER's order
const RulerTask& ruler_task(const std::string& name);  // InvalidInput naming --tasks

struct RulerSample {
  std::vector<std::int32_t> tokens;   // the prompt: at most `length` tokens, BOS first when the tokenizer has one
  std::vector<std::string> expected;  // the reference answers
  std::size_t needle_pos = 0;         // token position of the first needle (statement, list), for reports
  std::size_t question_pos = 0;       // where the question (and the answer prefix) begins: the context ends
};

// Sample `index` of `task` at `length` prompt tokens, deterministic in (seed, task, length,
// index). The prompt is built from separately tokenized pieces (template, haystack sentences,
// needles); the haystack is as long as fits. InvalidInput naming --lengths when the length
// cannot hold the task's fixed text. `depth` (needle tasks only, niah_*; InvalidInput naming
// --depths otherwise or outside [0, 1]): every needle at that fraction of the haystack, at the
// boundary between haystack segments nearest to depth x segments (0: before the first, 1: after
// the last), in RULER's shuffled order; the haystack, keys and values are those of the same index
// without a depth (needles at random boundaries), so a depth x length grid of one index moves the
// same needles through the same text.
RulerSample make_ruler_sample(const Tokenizer& tok, const RulerTask& task, std::size_t length, std::size_t index,
                              std::uint64_t seed, AnswerPrefix prefix, std::optional<double> depth = std::nullopt);
// Whether `task` takes a depth (the needle tasks, niah_*).
bool ruler_task_has_depth(const std::string& task);

// RULER's string_match_all: the fraction of `expected` found in `answer`, case-insensitive, in [0, 1].
double ruler_score(const std::string& answer, const std::vector<std::string>& expected);

}  // namespace akv
