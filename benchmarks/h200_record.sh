#!/usr/bin/env bash
# The command of record for issue 7 on the device machine: the live tunes of four zoo kernels (150 configs each)
# under triton.autotune, the exhaustive policy on fasta-sm's compile pool and fasta, cold and with the pool up,
# with the crash test; then the warm start in fresh processes. Outputs land in $OUT: the JSON, the two logs, and
# the sixteen state files packed into one states.tar (the device returns at most 8 files: run zi's loose ones came
# back five of sixteen).
#
# Here, once:  pip download 'transitions>=0.9.1,<0.10' platformdirs threadpoolctl --no-deps -d .h200/wheels
# Here, before each call (the device has no .git; a stale rev names the wrong code):
#              git describe --always --dirty --abbrev=7 > .h200/rev
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
(cd "$OUT" && python3 -m tarfile -c states.tar ks && rm -r ks) || echo "states: left loose in $OUT/ks (packing failed)"
date -u
timeout 110 python3 benchmarks/warm_start.py --runs 7 --device cuda --profile 40 > "$OUT/warm_start.log" 2>&1
echo "warm_start rc=$?"
date -u
tail -30 "$OUT/triton_autotune.log"
grep "^fresh-process" "$OUT/warm_start.log"; grep -A22 "cum ms" "$OUT/warm_start.log"
