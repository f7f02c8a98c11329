"""What the GPU benchmark scripts promise: a one-line reason where there is no device, no folders left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from bench_env import scratch  # noqa: E402


def test_scratch_removes_the_folders_made_under_it_by_this_process_and_its_children():
    with scratch("test") as root:
        own = tempfile.mkdtemp(prefix="state-")
        child = subprocess.run(
            [sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp(prefix='child-'))"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        assert Path(own).parent == Path(root) == Path(child).parent
    assert not Path(root).exists()


def test_scratch_gives_tempfile_and_tmpdir_back_as_they_were(monkeypatch):
    monkeypatch.setenv("TMPDIR", tempfile.gettempdir())
    before = os.environ["TMPDIR"], tempfile.tempdir
    with scratch("test"):
        pass
    assert (os.environ["TMPDIR"], tempfile.tempdir) == before


@pytest.mark.parametrize("script", ["triton_autotune.py", "inductor_model.py"])
def test_a_gpu_script_without_a_gpu_stops_with_one_line_naming_itself(script):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the scripts run there")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(BENCHMARKS / script)], capture_output=True, text=True, env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"{script}: needs a CUDA GPU, and torch sees none" + (
        "; on a CPU, run it under TRITON_INTERPRET=1 with --small (figures meaningless)"
        if script == "triton_autotune.py" else "")]
