#!/usr/bin/env python3
"""Module dependency check: a header included across modules implies a link dependency.

Every module of lib/akv is its own CMake target, and every target shares lib/ as its include
root, so the compiler alone would accept `#include "akv/eval/..."` from akv_quant. This check
reads each module's akv_module(NAME ... DEPS ...) call (lib/akv/CMakeLists.txt; its akv::X
entries) and fails, one line per finding, when
- a file of lib/akv/M includes akv/N/... and N is not among M's (transitive) link dependencies,
- a unit test includes a module header its test binary does not link (transitively),
- the module graph has a cycle.
Usage: check_module_deps.py [SOURCE_ROOT]
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parents[2])
lib = root / "lib" / "akv"
module_re = re.compile(r"akv_module\(\s*(\w+)([^)]*)\)", re.S)
include_re = re.compile(r'^\s*#\s*include\s+"akv/(\w+)/[^"]+"', re.M)

deps = {}
for cmake in sorted(lib.glob("*/CMakeLists.txt")):
    module = cmake.parent.name
    deps.setdefault(module, set())
    for target, args in module_re.findall(cmake.read_text()):
        if target == module:
            deps[module] |= set(re.findall(r"akv::(\w+)", args))


def closure(names):
    seen, todo = set(), list(names)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(deps.get(n, ()))
    return seen


problems = []
for module in sorted(deps):
    if module in closure(deps[module]):
        problems.append(f"cycle: akv::{module} depends on itself through {sorted(deps[module])}")
    allowed = closure(deps[module]) | {module}
    for src in sorted((lib / module).glob("*")):
        if src.suffix not in (".h", ".cpp"):
            continue
        for used in include_re.findall(src.read_text()):
            if used not in allowed:
                problems.append(f"{src.relative_to(root)}: includes akv/{used}/ but akv::{module} "
                                f"does not link akv::{used}")

tests_cmake = root / "tests" / "unit" / "CMakeLists.txt"
for name, args in re.findall(r"^akv_unit_test\((\w+)([^)]*)\)", tests_cmake.read_text(), re.M):
    allowed = closure(re.findall(r"akv::(\w+)", args))
    src = tests_cmake.parent / f"{name}.cpp"
    for used in include_re.findall(src.read_text()):
        if used not in allowed:
            problems.append(f"{src.relative_to(root)}: includes akv/{used}/ but {name} does not "
                            f"link akv::{used}")

for p in problems:
    print(p)
print(f"{len(deps)} modules checked: {len(problems)} problems")
sys.exit(1 if problems else 0)
