#!/usr/bin/env bash
# One GPU test suite on the device machine, whose image lacks two of fasta-sm's dependencies and has no network.
#
# Here, once:  pip download 'transitions>=0.9.1,<0.10' platformdirs threadpoolctl --no-deps -d .h200/wheels
# Here, before each call (the device has no .git; a stale rev names the wrong code):
#              git describe --always --dirty --abbrev=7 > .h200/rev
# There:       bash benchmarks/h200_suite.sh triton 420   (with .h200 carried; the log lands in $OUT)
#              bash benchmarks/h200_suite.sh triton 420 test_autotune.py test_backend.py   (those files only,
#              for a suite longer than one call)
set -u
suite=$1
limit=$2
shift 2
paths=("tests/$suite")
if [ $# -gt 0 ]; then paths=("${@/#/tests/$suite/}"); fi
echo "working tree: $(cat .h200/rev)"
python3 -m pip install -q --no-index --no-deps .h200/wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -1
export PYTHONPATH=$PWD
python3 -c "import sys, torch, triton, fasta_sm; print(sys.version.split()[0], torch.__version__, triton.__version__, \
torch.cuda.get_device_name(), fasta_sm.__file__)"
date -u
timeout "$limit" python3 -m pytest -q -p no:cacheprovider -rs --durations=10 "${paths[@]}" > "$OUT/h200_${suite}.log" 2>&1
echo "rc=$?"
date -u
tail -28 "$OUT/h200_${suite}.log"
