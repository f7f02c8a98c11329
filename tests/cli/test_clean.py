"""`fasta-sm clean`: the state files set aside go on request; tunes, locks and a running tune's past stay.

CliRunner keeps stderr apart from stdout since click 8.2 (pyproject asks for it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from fasta_sm.cli import main
from fasta_sm.store import StateStore


def invoke(*args: str) -> tuple[str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout, result.stderr


@pytest.fixture
def set_aside(table_file: Path, state_dir: Path) -> dict[str, Path]:
    """A DONE tune, one quarantined file beside it and one superseded state of its key."""
    invoke("tune", "--replay", str(table_file), "--policy", "random", "--budget", "0.5", "--state-dir", str(state_dir))
    store = StateStore(state_dir)
    (state,) = store.state_files()
    key = store.read(state).key
    superseded = store.supersede(key, "a test changed its settings")
    corrupt = state.with_name(state.name + ".corrupt-20261204T000000Z")
    corrupt.write_bytes(b"garbage")
    return {"state": state, "lock": store.lock_path_for(key), "superseded": superseded, "corrupt": corrupt, "key": key}


def test_clean_removes_quarantined_files_and_keeps_tunes_locks_and_superseded_states(set_aside, state_dir):
    out, _ = invoke("clean", "--state-dir", str(state_dir))
    assert out == f"removed {set_aside['corrupt'].name}\n"
    assert sorted(state_dir.iterdir()) == sorted([set_aside["state"], set_aside["lock"], set_aside["superseded"]])


def test_clean_says_how_many_superseded_states_it_kept_and_how_to_remove_them(set_aside, state_dir):
    _, said = invoke("clean", "--state-dir", str(state_dir))
    assert f"removed 1 of the 2 state files set aside in {state_dir}" in said
    assert "1 superseded kept (--superseded removes them too)" in said


def test_clean_with_superseded_removes_superseded_states_too(set_aside, state_dir):
    invoke("clean", "--superseded", "--state-dir", str(state_dir))
    assert sorted(state_dir.iterdir()) == sorted([set_aside["state"], set_aside["lock"]])


def test_a_dry_run_names_what_would_go_and_removes_nothing(set_aside, state_dir):
    before = sorted(state_dir.iterdir())
    out, _ = invoke("clean", "--superseded", "--dry-run", "--state-dir", str(state_dir))
    assert sorted(out.splitlines()) == sorted(f"would remove {set_aside[k].name}" for k in ("corrupt", "superseded"))
    assert sorted(state_dir.iterdir()) == before


def test_a_superseded_state_of_a_kernel_being_tuned_is_kept_and_named(set_aside, state_dir):
    with StateStore(state_dir).lock(set_aside["key"], "toy_mm"):
        out, said = invoke("clean", "--superseded", "--state-dir", str(state_dir))
    assert set_aside["superseded"].exists() and not set_aside["corrupt"].exists()
    assert f"kept 1 superseded whose kernel is being tuned now: {set_aside['superseded'].name}" in said
    assert set_aside["superseded"].name not in out


def test_clean_of_a_state_dir_with_nothing_set_aside_says_so(table_file, state_dir):
    invoke("tune", "--replay", str(table_file), "--policy", "random", "--budget", "0.5", "--state-dir", str(state_dir))
    out, said = invoke("clean", "--superseded", "--state-dir", str(state_dir))
    assert out == "" and f"nothing set aside in {state_dir}" in said


def test_clean_of_a_named_state_dir_that_does_not_exist_is_an_error_and_creates_nothing(tmp_path):
    missing = tmp_path / "typo"
    result = CliRunner().invoke(main, ["clean", "--state-dir", str(missing)])
    assert result.exit_code == 1 and f"no state dir {missing}" in result.output
    assert not missing.exists()


def test_a_file_clean_cannot_remove_is_named_in_an_error_after_the_others_went(set_aside, state_dir, monkeypatch):
    unlink = Path.unlink

    def refuse_corrupt(path: Path, missing_ok: bool = False) -> None:
        if ".corrupt-" in path.name:
            raise PermissionError(13, "Permission denied", str(path))
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refuse_corrupt)
    result = CliRunner().invoke(main, ["clean", "--superseded", "--state-dir", str(state_dir)])
    assert result.exit_code == 1 and not set_aside["superseded"].exists()
    assert f"cannot remove {set_aside['corrupt']}: Permission denied" in result.stderr


def test_a_directory_set_aside_is_kept_and_named_not_an_error_at_every_clean(set_aside, state_dir):
    """A quarantine moves a directory that stood at a state file's name aside as `*.fsm.corrupt-*`: clean never
    deletes a tree, and its dry run must not say it would."""
    folder = set_aside["state"].with_name(set_aside["state"].name + ".corrupt-20261204T000001Z")
    folder.mkdir()
    (folder / "inside").write_text("kept")
    for dry in (["--dry-run"], []):
        out, said = invoke("clean", *dry, "--state-dir", str(state_dir))
        assert folder.name not in out
        assert f"kept 1 set aside that is a directory (clean removes files only; yours to inspect and delete): " \
               f"{folder.name}" in said
    assert (folder / "inside").read_text() == "kept" and not set_aside["corrupt"].exists()


def test_a_dry_run_keeps_a_superseded_state_of_a_kernel_being_tuned_as_clean_does(set_aside, state_dir):
    with StateStore(state_dir).lock(set_aside["key"], "toy_mm"):
        out, said = invoke("clean", "--superseded", "--dry-run", "--state-dir", str(state_dir))
    assert out == f"would remove {set_aside['corrupt'].name}\n" and set_aside["superseded"].exists()
    assert f"would remove 1 of the 2 state files set aside in {state_dir}" in said
    assert f"would keep 1 superseded whose kernel is being tuned now: {set_aside['superseded'].name}" in said


def test_clean_of_one_file_set_aside_says_file_in_the_singular(state_dir):
    state_dir.mkdir()
    (state_dir / "0123.fsm.corrupt-20261204T000000Z").write_bytes(b"garbage")
    _, said = invoke("clean", "--state-dir", str(state_dir))
    assert f"removed 1 of the 1 state file set aside in {state_dir}" in said


def test_clean_leaves_files_named_as_state_or_lock_files_and_counts_each_file_once(state_dir):
    """Names no tune writes: one matching both patterns was removed and counted twice, and `*.fsm` / `*.lock`
    names, which ls lists as state files and tunes lock, were removed as set aside."""
    state_dir.mkdir()
    kept = [state_dir / "a.fsm.corrupt-1.fsm", state_dir / "a.fsm.corrupt-1.lock"]
    both = state_dir / "b.fsm.superseded-1.fsm.corrupt-2"
    for path in [*kept, both]:
        path.write_bytes(b"x")
    out, said = invoke("clean", "--superseded", "--state-dir", str(state_dir))
    assert out == f"removed {both.name}\n" and "removed 1 of the 1 state file set aside" in said
    assert all(path.exists() for path in kept) and not both.exists()
