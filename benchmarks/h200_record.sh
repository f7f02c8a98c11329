#!/usr/bin/env bash
# The command of record for issue 7 on the device machine: the live tunes of four zoo kernels (150 configs each)
# under triton.autotune, the exhaustive policy on fasta-sm's compile pool and fasta, cold and with the pool up,
# with the crash test; then the warm start in fresh processes. Outputs land in $OUT.
#
# Here, once:  pip download transitions platformdirs threadpoolctl --no-deps -d .h200/wheels; git rev-parse --short HEAD > .h200/rev
# There:       bash benchmarks/h200_record.sh   (with .h200 carried; fits one 600 s call)
set -u
echo "working tree: $(cat .h200/rev)"
python3 -m pip install -q --no-index --no-deps .h200/wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -1
export PYTHONPATH=$PWD
python3 -c "import sys, torch, triton, fasta_sm; print(sys.version.split()[0], torch.__version__, triton.__version__, \
torch.cuda.get_device_name())"
date -u
timeout 440 python3 benchmarks/triton_autotune.py --kernels mm_skinny_bf16 rmsnorm row_sum add_gelu \
  --methods triton exhaustive fasta exhaustive-pool-up fasta-pool-up \
  --max-configs 150 --warmup-ms 10 --rep-ms 40 --pick-repeats 7 --crash \
  --keep-states "$OUT/ks" --json "$OUT/triton_autotune.json" > "$OUT/triton_autotune.log" 2>&1
echo "triton_autotune rc=$?"
date -u
timeout 110 python3 benchmarks/warm_start.py --runs 7 --device cuda > "$OUT/warm_start.log" 2>&1
echo "warm_start rc=$?"
date -u
tail -30 "$OUT/triton_autotune.log"
tail -8 "$OUT/warm_start.log"
