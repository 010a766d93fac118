#!/usr/bin/env python3
"""Rotates golden rows with ggml's own CPU Walsh-Hadamard kernel (what llama.cpp runs when it
rotates a quantized KV cache: ggml_mul_mat with the hint GGML_HINT_SRC0_IS_HADAMARD, computed by
ggml_compute_forward_fwht) and writes inputs and outputs as golden data for akv's rotation
(lib/akv/quant/rotation.h, tests/unit/test_quant.cpp):

  scripts/dev/golden/ggml_fwht.py GGML_INCLUDE_DIR GGML_LIB_DIR OUT.json [--commit C]

GGML_INCLUDE_DIR holds ggml.h and ggml-cpu.h (llama.cpp's ggml/include), GGML_LIB_DIR the built
libggml-base and libggml-cpu (llama.cpp's build/bin). A 30-line C program, written to a temporary
directory and compiled with `cc` against them, builds the one-node graph on one thread; nothing of
ggml is copied, OUT.json holds numbers only (f32 bit patterns). Rows: block sizes 64 and 128 (the
key and value blocks llama.cpp uses at head_dim 64 and 128), Gaussian values with an outlier
channel, deterministic (numpy's PCG64, seed 7).
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "ggml.h"
#include "ggml-cpu.h"
#include <math.h>
/* argv[1] = n (block), argv[2] = rows; f32 rows on stdin; the rotated rows on stdout */
int main(int argc, char ** argv) {
    int n = atoi(argv[1]), rows = atoi(argv[2]);
    struct ggml_init_params p = { (size_t) 64 * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(p);
    struct ggml_tensor * rot = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, n);
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, rows);
    float * r = (float *) rot->data;
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) r[i * n + j] = (__builtin_popcount(i & j) & 1 ? -1.0f : 1.0f) / sqrtf((float) n);
    if (fread(x->data, sizeof(float), (size_t) n * rows, stdin) != (size_t) n * rows) return 1;
    struct ggml_tensor * y = ggml_mul_mat(ctx, rot, x);
    ggml_mul_mat_set_hint(y, GGML_HINT_SRC0_IS_HADAMARD);
    struct ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, y);
    if (ggml_graph_compute_with_ctx(ctx, g, 1) != GGML_STATUS_SUCCESS) return 2;
    fwrite(y->data, sizeof(float), (size_t) n * rows, stdout);
    ggml_free(ctx);
    return 0;
}
"""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("include_dir")
    p.add_argument("lib_dir")
    p.add_argument("out")
    p.add_argument("--commit", default="", help="the ggml / llama.cpp commit, recorded in OUT.json")
    a = p.parse_args()
    rng = np.random.Generator(np.random.PCG64(7))
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "fwht.c", Path(tmp) / "fwht"
        src.write_text(HARNESS)
        subprocess.run(["cc", "-O2", "-o", str(exe), str(src), f"-I{a.include_dir}", f"-L{a.lib_dir}",
                        f"-Wl,-rpath,{a.lib_dir}", "-lggml-cpu", "-lggml-base", "-lm"], check=True)
        for n in (64, 128):
            rows = 6
            x = rng.standard_normal((rows, n)).astype(np.float32)
            x[:, 3] = 20.0 + 4.0 * x[:, 3]  # an outlier channel
            out = subprocess.run([str(exe), str(n), str(rows)], input=x.tobytes(), capture_output=True, check=True)
            y = np.frombuffer(out.stdout, dtype=np.float32).reshape(rows, n)
            cases.append({"block": n, "rows": rows, "x_bits": x.view(np.uint32).ravel().tolist(),
                          "y_bits": y.view(np.uint32).ravel().tolist()})
    doc = {"generator": "scripts/dev/golden/ggml_fwht.py", "ggml_commit": a.commit,
           "kernel": "ggml_compute_forward_fwht (ggml_mul_mat + GGML_HINT_SRC0_IS_HADAMARD), CPU, 1 thread",
           "cases": cases}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}: {len(cases)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
