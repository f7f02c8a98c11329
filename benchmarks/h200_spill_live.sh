#!/usr/bin/env bash
# The policy's spill rules live, on kernels whose slowest configs spill registers (a square matmul and two
# attentions), which the command of record (h200_record.sh) does not tune. First the exhaustive policy against fasta
# on three kernels (fp16 matmul 4096^3, fp16 attention d64, bf16 attention d128, at most 150 configs each), then
# triton.autotune against fasta on the first two, all from cold caches. The state files come back packed in
# states.tar (ks: the first part, ks2: the second). This is run zzb's command (docs/benchmarks.md).
#
# Here, before each call:  git describe --always --dirty --abbrev=7 > .h200/rev   (wheels as in h200_record.sh)
# There:                   bash benchmarks/h200_spill_live.sh   (with .h200 carried; about 300 s)
set -u
echo "working tree: $(cat .h200/rev)"
python3 -m pip install -q --no-index --no-deps .h200/wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -1
export PYTHONPATH=$PWD
python3 -c "import sys, torch, triton, fasta_sm; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())"
date -u
timeout 250 python3 benchmarks/triton_autotune.py --kernels mm_fp16 attention attention_d128 --methods exhaustive fasta --max-configs 150 --warmup-ms 10 --rep-ms 40 --pick-repeats 7 --keep-states "$OUT/ks" --json "$OUT/a.json" > "$OUT/a.log" 2>&1
echo "a rc=$?"; date -u
timeout 300 python3 benchmarks/triton_autotune.py --kernels mm_fp16 attention --methods triton fasta --max-configs 150 --warmup-ms 10 --rep-ms 40 --pick-repeats 7 --keep-states "$OUT/ks2" --json "$OUT/b.json" > "$OUT/b.log" 2>&1
echo "b rc=$?"; date -u
(cd "$OUT" && python3 -m tarfile -c states.tar ks ks2 && rm -r ks ks2)
tail -6 "$OUT/a.log"; tail -5 "$OUT/b.log"
