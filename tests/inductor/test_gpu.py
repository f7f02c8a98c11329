"""torch.compile with fasta-sm on a CUDA GPU: tune across compile workers, reuse, resume, quarantine.

Run on the GPU machine: `pytest -m gpu tests/inductor`. Skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (Inductor's Triton autotuner only runs there)"
    ),
]

from fasta_sm.store import StateStore

HERE = Path(__file__).parent


def compile_once(state_dir: Path, **env: str) -> dict:
    """One fresh process with a fresh Inductor cache: every kernel goes through the compile workers.

    Output goes to files and the child runs in its own session, killed as a
    group afterwards: compile workers a killed child leaves behind must neither
    hold our pipes open nor outlive the test.
    """
    full = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="fasta-gpu-"), **env}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen([sys.executable, str(HERE / "compile_child.py"), str(state_dir)],
                                 stdout=out, stderr=err, text=True, env=full, start_new_session=True)
        try:
            returncode = child.wait(timeout=500)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if env.get("FASTA_SM_TEST_KILL_AFTER_BENCH"):
        return {"returncode": returncode}
    assert returncode == 0, stderr[-4000:]
    return json.loads(stdout.strip().splitlines()[-1])


def states(state_dir: Path):
    store = StateStore(state_dir)
    return {p.name: store.read(p) for p in store.state_files()}


def test_tunes_in_workers_and_parent_then_reuses(tmp_path):
    state_dir = tmp_path / "states"
    report = compile_once(state_dir)
    assert report["correct"] and report["states"], "kernels were tuned (state files written)"
    tuned = states(state_dir)
    assert tuned and all(s.done for s in tuned.values())
    for state in tuned.values():
        must = state.policy_params.get("must", [])
        assert must and set(must) <= set(state.rounds[0].batch), "Inductor's own configs are in R1"
        defaults = [state.mean_us(i) for i in must if i in state.durations]
        assert state.best_us <= min(defaults), "never slower than Inductor's own pick under the same timing"
        if state.n_configs >= 40:
            assert state.measured_count() < state.n_configs, "a rich space is not measured exhaustively"
    blobs = {p.name: p.read_bytes() for p in StateStore(state_dir).state_files()}

    again = compile_once(state_dir)
    assert again["correct"]
    reread = {p.name: p.read_bytes() for p in StateStore(state_dir).state_files()}
    assert reread == blobs, "a finished tune is reused as is"


def test_killed_mid_autotune_resumes(tmp_path):
    state_dir = tmp_path / "states"
    killed = compile_once(state_dir, FASTA_SM_TEST_KILL_AFTER_BENCH="5")
    if killed["returncode"] == 0:
        pytest.skip("every tune finished within 5 timings: nothing to interrupt")
    assert killed["returncode"] in (9, -9)
    cut = states(state_dir)
    assert cut and not all(s.done for s in cut.values())
    report = compile_once(state_dir)
    assert report["correct"]
    resumed = states(state_dir)
    assert all(s.done for s in resumed.values())
    for name, before in cut.items():
        if before.durations:
            assert set(before.durations) <= set(resumed[name].durations), "measured work is kept"


def test_corrupt_state_file_never_breaks_compilation(tmp_path):
    state_dir = tmp_path / "states"
    compile_once(state_dir)
    for path in StateStore(state_dir).state_files():
        path.write_bytes(b"\xc1 garbage")
    report = compile_once(state_dir)
    assert report["correct"]
    assert list(state_dir.glob("*.corrupt-*"))
    assert all(s.done for s in states(state_dir).values())


def test_kernels_inductor_compiles_only_to_time_a_fusion_are_left_to_inductor(tmp_path):
    state_dir = tmp_path / "states"
    report = compile_once(state_dir, FASTA_SM_TEST_BENCHMARK_FUSION="1")
    assert report["correct"]
    if not any(name.startswith("Placeholder.") for name in report["names"]):
        pytest.skip("Inductor timed no fusion choice in this process")
    assert report["states"], "the kernels the program runs were tuned"
    assert not [s for s in report["states"] if s["kernel"].startswith("Placeholder.")]
