#!/usr/bin/env python3
"""Quantizes the rows of data/golden/ggml-quantize.json with ggml's own C reference quantizers
(the `from_float_ref` of each type's traits: quantize_row_q4_0_ref, ..., quantize_row_iq4_nl_ref)
and writes their blocks as golden data for akv's ggml KV cache types
(lib/akv/tensor/ggml_quant.h, tests/unit/test_gguf.cpp):

  scripts/dev/golden/ggml_quant_ref.py GGML_SRC_DIR GGML_BUILD_DIR OUT.json [--commit C]

GGML_SRC_DIR is a checkout of ggml (github.com/ggml-org/ggml, or llama.cpp's ggml/ directory),
GGML_BUILD_DIR its CMake build (it holds libggml-base). A 20-line C program, written to a
temporary directory and compiled with `cc` against the build, calls ggml's public API
(ggml_get_type_traits(type)->from_float_ref); nothing of ggml is copied, OUT.json holds numbers
only. Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (also in ggml-quantize.json, from gguf-py: the script
reports whether the two references agree) and IQ4_NL.
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "IQ4_NL": 20}

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "ggml.h"
/* argv[1] = n; f32 values (little-endian) on stdin; one line "type hex" per type id argv[2..] */
int main(int argc, char ** argv) {
    int n = atoi(argv[1]);
    float * x = malloc(sizeof(float) * n);
    if (fread(x, sizeof(float), n, stdin) != (size_t) n) return 1;
    for (int a = 2; a < argc; ++a) {
        enum ggml_type t = (enum ggml_type) atoi(argv[a]);
        size_t size = ggml_row_size(t, n);
        unsigned char * y = calloc(size, 1);
        ggml_get_type_traits(t)->from_float_ref(x, y, n);
        printf("%d ", (int) t);
        for (size_t i = 0; i < size; ++i) printf("%02x", y[i]);
        printf("\n");
        free(y);
    }
    return 0;
}
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src")
    p.add_argument("build")
    p.add_argument("out")
    p.add_argument("--commit", default="")
    a = p.parse_args()
    src, build = Path(a.src).resolve(), Path(a.build).resolve()
    libdirs = sorted({str(f.parent) for f in build.rglob("libggml-base.*")})
    if not libdirs:
        sys.exit(f"golden_ggml_ref: no libggml-base under {build}")
    base = json.load(open(ROOT / "data/golden/ggml-quantize.json"))
    n = base["n"]
    raw = bytes.fromhex(base["input"])
    # ggml-quantize.json stores big-endian f32 bit patterns; the harness reads native (x86) floats.
    le = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "quantize"
        (Path(tmp) / "q.c").write_text(HARNESS)
        subprocess.run(["cc", "-O2", str(Path(tmp) / "q.c"), f"-I{src / 'include'}", f"-L{libdirs[0]}", "-lggml-base",
                        f"-Wl,-rpath,{libdirs[0]}", "-o", str(exe)], check=True)
        out = subprocess.run([str(exe), str(n)] + [str(i) for i in TYPES.values()], input=le, capture_output=True,
                             check=True).stdout.decode()
    blocks = {int(line.split()[0]): line.split()[1] for line in out.splitlines() if line}
    gguf_py = {t["type"]: t["blocks"] for t in base["types"]}
    for name, tid in TYPES.items():
        if name in gguf_py:
            same = gguf_py[name] == blocks[tid]
            print(f"{name}: ggml's C reference {'equals' if same else 'DIFFERS from'} gguf-py's blocks")
    doc = {"format": "akv-golden-ggml-quantize", "version": 1,
           "reference": {"repository": "ggml-org/ggml", "commit": a.commit,
                         "api": "ggml_get_type_traits(type)->from_float_ref (ggml-base, C reference quantizers)"},
           "input": base["input"], "n": n,
           "types": [{"type": name, "blocks": blocks[tid]} for name, tid in TYPES.items()]}
    tmp_out = a.out + ".tmp"
    with open(tmp_out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    Path(tmp_out).replace(a.out)


if __name__ == "__main__":
    main()
