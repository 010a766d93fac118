"""Independent checks of akv caches with h5py (tests/cli/test_compress.sh).

  cache_tool.py bytes CACHE          prints the sum of stored dataset sizes per component as JSON
  cache_tool.py shorten CACHE PATH   rewrites dataset PATH one element shorter (corrupt data)
  cache_tool.py decoded CACHE DUMP L H   checks a head's key residual rows equal the f16 dump rows
  cache_tool.py set_int CACHE PATH NAME V sets integer attribute NAME of object PATH to V
"""
import json
import sys

import h5py
import numpy as np

COMPONENT = {"codes": "codes", "blocks": "codes", "scale": "scales", "zero": "zeros", "residual": "residual",
             "outlier_channels": "outliers", "outlier_values": "outliers", "kept": "indices",
             # nuq (version 6): the table and per-row offsets/ranges, f16 sink rows, sparse outliers
             "levels": "scales", "upper": "scales", "lower": "scales", "offset": "scales", "range": "scales",
             "sink": "residual", "sparse_values": "outliers", "sparse_channels": "indices",
             "sparse_counts": "indices"}


def stored_bytes(path):
    totals = {k: 0 for k in set(COMPONENT.values())}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            totals[COMPONENT[name.rsplit("/", 1)[-1]]] += obj.id.get_storage_size()

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    totals["total"] = sum(totals.values())
    return totals


def shorten(path, name):
    with h5py.File(path, "r+") as f:
        data = f[name][...]
        del f[name]
        f.create_dataset(name, data=data[:-1])


def main():
    cmd = sys.argv[1]
    if cmd == "bytes":
        print(json.dumps(stored_bytes(sys.argv[2]), sort_keys=True))
    elif cmd == "shorten":
        shorten(sys.argv[2], sys.argv[3])
    elif cmd == "set_int":
        with h5py.File(sys.argv[2], "r+") as f:
            f[sys.argv[3]].attrs[sys.argv[4]] = np.int64(int(sys.argv[5]))
    elif cmd == "decoded":
        cache, dump, layer, head = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        with h5py.File(cache, "r") as c, h5py.File(dump, "r") as d:
            g = c[f"layers/{layer}/heads/{head}/key"]
            nq = int(g.attrs["n_quant"])
            res = g["residual"][...]
            want = d[f"layers/{layer}/key"][head, nq:, :].astype(np.float16)
            assert res.dtype == np.float16, res.dtype
            assert np.array_equal(res, want), "residual rows differ from the dump"
            print("residual ok", nq, res.shape)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
