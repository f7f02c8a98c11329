"""A compile worker in a fresh process: build the autotuner, precompile(warm_cache_only=True), pickle it."""

import json
import pickle
import sys

from fake_autotuner import CALLS, FastaFake

if __name__ == "__main__":
    table_path, state_dir, out = sys.argv[1:4]
    kernel = FastaFake(table_path, state_dir)
    kernel.precompile(warm_cache_only=True)
    with open(out, "wb") as handle:
        pickle.dump(kernel, handle)
    print(json.dumps({"compiled": CALLS["compile"], "results": len(kernel.compile_results)}))
