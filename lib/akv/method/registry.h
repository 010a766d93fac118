#pragma once
// The method registry: every cache method akv knows (name, kind, help) and every parameter a
// method takes (name, type, range, help). It drives the parsing of `name:flag=value` specs and
// of the matching command-line flags, the lists in --help, and the names in error messages;
// a new method or parameter is one row here (plus its resolution in params.cpp).
#include <initializer_list>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/method/eviction_params.h"
#include "akv/method/request.h"

namespace akv {

// The f32 reference cache of model runs: not a compression method (it stores what the model
// computed), but a name every method list of a model run accepts, and the first method of every
// report.
inline constexpr const char* kFullMethod = "full";

enum class MethodKind { quantizer, preset, eviction, joint, tiered, ggml, reference };

// One row per method: its name, kind and help, and what the kind needs from it. Resolution
// (params.cpp, eviction_params.cpp) reads these fields; nothing else lists methods.
struct MethodInfo {
  const char* name;
  MethodKind kind;
  const char* help;
  int bits_key = 0, bits_value = 0;          // preset: kivi's bits; tiered preset: the warm tier's
  std::size_t hot = 0;                       // tiered preset: hot tokens (0: the row is no preset)
  ScoreMethod score = ScoreMethod::snapkv;   // eviction, joint: the token score,
  AllocMethod alloc = AllocMethod::uniform;  // the budget allocator
  std::size_t sinks = 0;                     // and the default attention sinks
  double alpha = 0.2;                        // and Ada-KV's floor (kvzip's global top-k: 0)
  CapacityRule capacity_rule = CapacityRule::official;  // and Ada-KV's capacities
  bool critical = false;                     // and CriticalKV's two stages (score/critical.h)
  long long window = -1;                     // and the forced recent tokens (-1: the score's default)
};

// Every method, in the order help lists them. The reference `full` (kFullMethod: f32 K/V as the
// model computed them) is a row of its own kind: model runs take it, no cache file is made of it.
const std::vector<MethodInfo>& method_registry();
const MethodInfo* find_method(const std::string& name);  // nullptr when unknown
// "a, b, c" of the methods of the given kinds (when empty: every method a cache file can be
// made with, i.e. all but the reference).
std::string method_list(std::initializer_list<MethodKind> kinds = {});

// Which methods take a parameter: quantizers and presets (and eviction methods for what they
// keep), eviction methods, the tiered cache.
enum class ParamScope { quant, eviction, tiered, ggml };

struct ParamInfo {
  using Integer = std::optional<long long>& (*)(CompressRequest&);
  using Real = std::optional<double>& (*)(CompressRequest&);
  using Text = std::optional<std::string>& (*)(CompressRequest&);
  using Flag = bool& (*)(CompressRequest&);

  const char* name;  // --NAME on the command line, NAME=VALUE in a spec
  ParamScope scope;
  std::variant<Integer, Real, Text, Flag> field;  // where the value goes
  const char* help;
  std::optional<double> lo, hi;        // numeric range, inclusive unless lo_open / hi_open
  bool lo_open = false, hi_open = false;
  std::vector<long long> choices;      // allowed integers (empty: any in range)
  std::vector<std::string> words;      // allowed text (empty: any, e.g. a file)
};

const std::vector<ParamInfo>& param_registry();
const ParamInfo* find_param(const std::string& name);  // nullptr when unknown
// The parameter's range or choices ("2, 3, 4 or 8", "[0, 1)", "max | avg"; "" when free) and
// its help after them.
std::string param_range(const ParamInfo& p);
std::string param_help(const ParamInfo& p);

// Parses `value` for parameter p (given as `flag`, e.g. "--bits" or "kivi:bits") into r.
// Throws UsageError when it is not a number, InvalidInput naming the flag and value when it is
// outside the parameter's range or choices.
void set_param(CompressRequest& r, const ParamInfo& p, const std::string& value, const std::string& flag);

// Checks every field of a request built another way (a library caller) against the same ranges;
// InvalidInput names the flag (--NAME) and the value.
void check_request(const CompressRequest& r);

// Values read from a file (JSON) for the registry parameter `param`, with the command line's type
// and range checks; CorruptData naming the file and `field` (e.g. "params.eviction.alpha")
// when the value is missing, of another type, fractional where an integer is meant, or out of
// range. file_count: a non-negative integer that is no registry parameter.
long long file_integer(const nlohmann::json& j, const char* key, const char* param, const std::string& file,
                       const std::string& field);
double file_real(const nlohmann::json& j, const char* key, const char* param, const std::string& file,
                 const std::string& field);
std::size_t file_count(const nlohmann::json& j, const char* key, const std::string& file, const std::string& field);

// A method with its flags in one string, as `akv evaluate --methods` takes it:
// "name[:flag=value...]" with the flags of `akv compress` without dashes, e.g.
// "kivi:bits-key=4:bits-value=2", "adakv:budget=0.2:quant=k4v2", "kivi-2:pre-rope".
// Throws UsageError naming an unknown flag (and listing the known ones).
CompressRequest parse_method_spec(const std::string& spec);

// A request whose method may itself be a spec (`akv compress --method kivi:bits=3`): the spec's
// flags join r's and its name replaces it; no change when r.method holds no ':'. A flag set both
// by the spec and in r -> UsageError naming the flag and the spec.
void join_method_spec(CompressRequest& r);

// Help text of the spec syntax: the methods by kind and the flags by scope.
std::string method_spec_help();

}  // namespace akv
