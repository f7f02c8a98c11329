"""The fasta-sm command, end to end on a replay table."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from toy_table import write_table

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.cli import main, run
from fasta_sm.errors import TuneFailed
from fasta_sm.protocols import BenchmarkOutcome
from fasta_sm.state import TuneState, pack_state
from fasta_sm.store import StateStore
from fasta_sm.tuner import open_tune
from fasta_sm.tuner import tune as api_tune


def invoke(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def tune(table: Path, state_dir: Path, *extra: str) -> str:
    return invoke("tune", "--replay", str(table), "--policy", "random", "--budget", "0.5",
                  "--state-dir", str(state_dir), *extra)


def test_tune_prints_winner_configs_tried_cost_and_regret(table_file, state_dir):
    out = tune(table_file, state_dir)
    for word in ("winner", "configs tried", "timings", "tuning cost", "regret"):
        assert word in out


def test_tune_counts_configs_and_rounds_as_ls_does(table_file, state_dir):
    out = invoke("tune", "--replay", str(table_file), "--state-dir", str(state_dir))
    listed = invoke("ls", "--state-dir", str(state_dir)).splitlines()[-1].split()
    ran, round_number = listed[listed.index("DONE") + 2].split("/")[0], listed[listed.index("DONE") + 1]
    assert f": {ran} ran, " in out and f"to R2_{round_number})" in out


@pytest.mark.parametrize("args", [
    ("tune", "--state-dir", ""),
    ("--state-dir", "", "ls"),
    ("bench", "--tables", ""),
], ids=["tune", "before the command", "bench tables"])
def test_an_empty_directory_name_is_refused_not_read_as_the_working_directory(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2 and "is empty (an unset shell variable?)" in result.output
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["tables", "bench", "graph"])
def test_a_state_dir_before_a_command_that_reads_no_state_is_refused_not_ignored(command, tmp_path):
    error = refused("--state-dir", str(tmp_path), command)
    assert f"--state-dir is for the commands that read or write tunes (clean, ls, report, show, tune); {command}" \
        in error


@pytest.mark.parametrize("command", ["tables", "record"])
def test_a_state_dir_before_a_command_that_reads_no_state_still_lets_its_help_through(command, tmp_path):
    out = invoke("--state-dir", str(tmp_path), command, "--help")
    assert f" {command} [OPTIONS]" in out and "--state-dir is for" not in out


def test_second_tune_reuses_the_done_state(table_file, state_dir):
    tune(table_file, state_dir)
    assert "reused" in tune(table_file, state_dir)


def test_ls_lists_one_line_per_state(table_file, state_dir):
    tune(table_file, state_dir)
    tune(table_file, state_dir, "--seed", "1")
    out = invoke("ls", "--state-dir", str(state_dir))
    assert out.count("toy_mm") == 2 and "DONE" in out


def test_ls_tells_apart_tunes_of_one_kernel_that_differ_by_budget_or_noise(table_file, state_dir):
    tune(table_file, state_dir)
    tune(table_file, state_dir, "--no-noise")
    invoke("tune", "--replay", str(table_file), "--policy", "random", "--budget", "0.25", "--state-dir", str(state_dir))
    out = invoke("ls", "--state-dir", str(state_dir))
    labels = re.findall(r"random seed 0 budget [\d.]+(?: no noise)?", out)
    expected = ["random seed 0 budget 0.25", "random seed 0 budget 0.5", "random seed 0 budget 0.5 no noise"]
    assert sorted(labels) == expected


def test_ls_lists_an_entry_it_cannot_open_as_unreadable_and_the_others_as_usual(table_file, state_dir):
    tune(table_file, state_dir)
    (state_dir / "dangling.fsm").symlink_to(state_dir / "nowhere")
    out = invoke("ls", "--state-dir", str(state_dir))
    assert "unreadable" in out and "dangling.fsm" in out and "DONE" in out


def test_ls_counts_the_state_files_set_aside_so_they_do_not_pile_up_unseen(table_file, state_dir):
    fasta = ("tune", "--replay", str(table_file), "--state-dir", str(state_dir))
    invoke(*fasta)
    next(state_dir.glob("*.fsm")).write_bytes(b"garbage")
    invoke(*fasta)  # quarantines the garbage, tunes afresh
    assert fasta_sm(*fasta, env={"FASTA_RETIME_TOP": "5"}).returncode == 0  # another setting: superseded
    done = fasta_sm("ls", "--state-dir", str(state_dir))
    assert done.returncode == 0 and "DONE" in done.stdout
    said = done.stderr.replace("\n", " ")
    assert f"2 state files set aside in {state_dir}: 1 unreadable (.corrupt-*;" in said and "1 superseded" in said


def test_show_of_a_kernel_whose_only_file_is_unreadable_names_that_file(table_file, state_dir):
    tune(table_file, state_dir)
    state_file = next(state_dir.glob("*.fsm"))
    state_file.write_bytes(b"garbage")
    done = fasta_sm("show", "toy_mm", "--state-dir", str(state_dir))
    assert done.returncode == 1 and f"1 file there cannot be read and may hold it: {state_file.name}" in done.stderr


def test_ls_says_nothing_of_set_aside_files_where_there_are_none(table_file, state_dir):
    tune(table_file, state_dir)
    assert "set aside" not in fasta_sm("ls", "--state-dir", str(state_dir)).stderr


def test_report_counts_the_readable_states_beside_an_entry_it_cannot_open(table_file, state_dir):
    tune(table_file, state_dir)
    (state_dir / "dangling.fsm").symlink_to(state_dir / "nowhere")
    out = invoke("report", "--state-dir", str(state_dir))
    assert "toy_mm" in out and "dangling.fsm" in out


def test_show_and_bench_into_a_pipe_print_every_cell_whole(tmp_path):
    shipped = {"FASTA_SM_STATE_DIR": str(tmp_path)}
    assert fasta_sm("tune", env=shipped).returncode == 0
    shown = fasta_sm("show", str(next(tmp_path.glob("*.fsm"))), env=shipped)
    benched = fasta_sm("bench", "--seeds", "1", "--policies", "fasta")
    assert "BLOCK_M=" in shown.stdout and "…" not in shown.stdout
    assert "attention_fwd_bf16_d128" in benched.stdout and "…" not in benched.stdout


def test_a_bad_budget_is_refused_before_anything_is_written(tmp_path):
    done = fasta_sm("tune", "--budget", "0", "--state-dir", str(tmp_path))
    assert done.returncode == 2 and "--budget" in done.stderr and "0.0 must be a fraction" in done.stderr
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("budget", ["2", "-1", "nan"])
def test_bench_refuses_a_budget_outside_0_1_as_a_usage_error_before_reading_tables(budget, tmp_path):
    done = fasta_sm("bench", "--tables", str(tmp_path / "nowhere"), "--budget", budget)
    assert done.returncode == 2 and "--budget" in done.stderr and "nowhere" not in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(("args", "listed"), [
    (("tune", "--policy"), "known: coordesc, exhaustive, fasta"),
    (("bench", "--seeds", "1", "--policies"), "bench runs: coordesc, fasta"),  # exhaustive is the yardstick there
], ids=["tune", "bench"])
def test_a_policy_users_cannot_run_is_refused_listing_those_they_can(args, listed):
    result = CliRunner().invoke(main, [*args, "must-measure"])
    assert result.exit_code == 2 and f"unknown policy 'must-measure'; {listed}" in " ".join(result.output.split())


def test_show_marks_the_last_error_of_a_finished_tune_as_history(table_file, state_dir):
    from fasta_sm.backends.replay import ReplayBackend, load_table
    from fasta_sm.errors import FastaError
    from fasta_sm.protocols import BenchmarkOutcome
    from fasta_sm.tuner import tune as run_tune

    class NaNOnce(ReplayBackend):
        def benchmark(self, configs, repeat=None):
            return BenchmarkOutcome(durations_us=[math.nan] * len(configs), seconds=0.0)

    table, store = load_table(table_file), StateStore(state_dir)
    settings = {"policy": "random", "policy_params": {"budget": 0.5}, "store": store}
    with pytest.raises(FastaError):
        run_tune("k", "toy_mm", table.configs, NaNOnce(table), **settings)
    assert "resumed since" not in invoke("show", str(store.file_for("k")), "--state-dir", str(state_dir))
    run_tune("k", "toy_mm", table.configs, ReplayBackend(table), **settings)
    assert "resumed since, and finished" in invoke("show", str(store.file_for("k")), "--state-dir", str(state_dir))


def test_show_marks_the_last_error_of_a_tune_that_has_moved_on_past_it_as_history(table_file, state_dir):
    from fasta_sm.backends.replay import ReplayBackend, load_table
    from fasta_sm.errors import FastaError
    from fasta_sm.protocols import BenchmarkOutcome
    from fasta_sm.tuner import open_tune
    from fasta_sm.tuner import tune as run_tune

    class NaNOnce(ReplayBackend):
        def benchmark(self, configs, repeat=None):
            return BenchmarkOutcome(durations_us=[math.nan] * len(configs), seconds=0.0)

    table, store = load_table(table_file), StateStore(state_dir)
    settings = {"policy": "fasta", "store": store}
    with pytest.raises(FastaError):
        run_tune("k", "toy_mm", table.configs, NaNOnce(table), **settings)
    with store.lock("k", "toy_mm"):
        resumed = open_tune(store, "k", "toy_mm", table.configs, ReplayBackend(table), policy="fasta")
        resumed.drive(until=lambda s: s.phase == "R2")
        resumed.close()
    shown = invoke("show", str(store.file_for("k")), "--state-dir", str(state_dir))
    assert "R1 benchmark: BackendError" in shown and "(resumed since)" in shown


def tune_where_nothing_compiles(tmp_path: Path, state_dir: Path, policy: str = "exhaustive",
                                params: dict | None = None) -> Path:
    """The state file of a tune that ended with no config run: every compile failed."""
    from fasta_sm.backends.replay import ReplayBackend, load_table
    from fasta_sm.errors import TuneFailed
    from fasta_sm.protocols import CompileOutcome
    from fasta_sm.tuner import tune as run_tune

    class NothingCompiles(ReplayBackend):
        def compile(self, configs):
            return [CompileOutcome(error="CompilationError: unsupported", seconds=0.1) for _ in configs]

    table, store = load_table(write_table(tmp_path / "t.json")), StateStore(state_dir)
    with pytest.raises(TuneFailed):
        run_tune("k", "toy_mm", table.configs, NothingCompiles(table), policy=policy, policy_params=params,
                 store=store)
    return store.file_for("k")


def test_a_config_a_tune_with_no_config_run_left_untried_is_never_tried_not_yet(tmp_path, state_dir):
    state_file = tune_where_nothing_compiles(tmp_path, state_dir, "random", {"budget": 0.1})
    state = StateStore.read(state_file)
    untried = next(i for i in range(state.n_configs) if i not in state.failed)
    shown = invoke("show", str(state_file), "--config", str(untried))
    assert f"#{untried}" in shown and "never tried; " in shown and "not tried yet" not in shown


def test_a_tune_that_ended_with_no_config_run_is_shown_as_such_not_as_resumable(tmp_path, state_dir):
    shown = invoke("show", str(tune_where_nothing_compiles(tmp_path, state_dir)), "--state-dir", str(state_dir))
    assert "with no winner: none of the" in shown and "resumes at the position above" not in shown
    assert "no config ran" in invoke("ls", "--state-dir", str(state_dir))


def test_show_json_is_the_documented_format(table_file, state_dir):
    tune(table_file, state_dir)
    state_file = next(state_dir.glob("*.fsm"))
    shown = json.loads(invoke("show", str(state_file), "--json", "--state-dir", str(state_dir)))
    assert shown["format"] == "fasta-sm.show/1"
    means = [m["mean_us"] for m in shown["measured"]]
    assert means == sorted(means)
    assert shown["best"]["index"] == shown["measured"][0]["index"]
    assert shown["position"]["phase"] == "DONE" and shown["stop_reason"]


def test_show_of_a_directory_says_it_is_one(tmp_path):
    (tmp_path / "x.fsm").mkdir()
    result = CliRunner().invoke(main, ["show", str(tmp_path / "x.fsm"), "--state-dir", str(tmp_path)])
    assert result.exit_code == 1 and "is a directory, not a state file" in result.output


def test_show_of_a_kernel_name_finds_its_tune_beside_a_folder_of_that_name(table_file, state_dir, tmp_path,
                                                                            monkeypatch):
    tune(table_file, state_dir)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "toy_mm").mkdir()
    assert "toy_mm" in invoke("show", "toy_mm", "--state-dir", str(state_dir))


def test_an_existing_writable_file_in_a_directory_this_process_cannot_write_is_taken(table_file, state_dir,
                                                                                     tmp_path, monkeypatch):
    """`--csv /dev/stdout` as a user who cannot write /dev: the file's permission is what counts."""
    tune(table_file, state_dir)
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "report.csv").write_text("")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != locked and real_access(path, mode))
    invoke("report", "--state-dir", str(state_dir), "--csv", str(locked / "report.csv"))
    assert "TOTAL replayed" in (locked / "report.csv").read_text()


def test_a_policy_setting_the_environment_gets_wrong_is_not_blamed_on_the_command_line(table_file, state_dir):
    done = fasta_sm("tune", "--replay", str(table_file), "--state-dir", str(state_dir), "--budget", "0.2",
                    env={"FASTA_MAX_ROUNDS": "0"})
    assert done.returncode == 1 and "FASTA_MAX_ROUNDS" in done.stderr and "Invalid value for" not in done.stderr


def tune_of_one_config(table_file: Path, state_dir: Path) -> str:
    """The output of an exhaustive tune of the table cut to its first config that runs."""
    table = json.loads(table_file.read_text())
    table["configs"] = [row for row in table["configs"] if row["error"] is None][:1]
    table_file.write_text(json.dumps(table))
    return invoke("tune", "--replay", str(table_file), "--policy", "exhaustive", "--state-dir", str(state_dir))


def test_tune_of_a_one_config_table_says_one_config(table_file, state_dir):
    assert ", 1 config)" in tune_of_one_config(table_file, state_dir)


def test_tune_of_a_one_config_table_says_one_timing(table_file, state_dir):
    assert "; 1 timing in 1 round (R1)" in tune_of_one_config(table_file, state_dir)


def test_show_of_a_tune_with_one_timing_says_one_timing(table_file, state_dir):
    tune(table_file, state_dir, "--budget", "0.01")
    assert "1/48 configs, 1 timing, 0 failed" in invoke("show", "toy_mm", "--state-dir", str(state_dir))


def test_show_unknown_key_is_a_clear_error(state_dir):
    result = CliRunner().invoke(main, ["show", "no-such-kernel", "--state-dir", str(state_dir)])
    assert result.exit_code != 0 and "no state file" in result.output


def test_show_of_a_key_with_undecodable_bytes_is_no_state_file_not_a_traceback(tmp_path):
    """A name typed in a non-UTF-8 locale reaches `show` as lone surrogates, which no stored key holds."""
    done = fasta_sm("show", "no-such\udcff", "--state-dir", str(tmp_path))
    assert done.returncode == 1 and "no state file for the key or kernel" in done.stderr
    assert "Traceback" not in done.stderr


def a_copied_state_file(table_file: Path, state_dir: Path, target: Path) -> bytes:
    tune(table_file, state_dir)
    (state_file,) = state_dir.glob("*.fsm")
    shutil.copyfile(state_file, target)
    return target.read_bytes()


def test_report_refuses_to_write_its_csv_over_a_state_file_outside_the_state_dir(table_file, state_dir, tmp_path):
    kept = tmp_path / "kept.fsm"
    before = a_copied_state_file(table_file, state_dir, kept)
    assert "a name fasta-sm gives a state file" in refused("report", "--state-dir", str(state_dir), "--csv", str(kept))
    assert kept.read_bytes() == before


def test_an_output_over_a_file_holding_a_tune_under_another_name_is_refused(table_file, state_dir, tmp_path):
    kept = tmp_path / "kept.bin"
    before = a_copied_state_file(table_file, state_dir, kept)
    said = refused("report", "--state-dir", str(state_dir), "--csv", str(kept))
    assert "holds a tune of kernel 'toy_mm'" in said
    assert kept.read_bytes() == before


def test_an_output_named_as_a_lock_is_refused_as_a_lock(state_dir, tmp_path):
    said = refused("report", "--state-dir", str(state_dir), "--csv", str(tmp_path / "k.lock"))
    assert "a name fasta-sm gives a lock" in said and "tune of key" not in said


def test_report_writes_csv_with_a_total_row(table_file, state_dir, tmp_path):
    tune(table_file, state_dir)
    out_csv = tmp_path / "report.csv"
    invoke("report", "--state-dir", str(state_dir), "--csv", str(out_csv))
    rows = list(csv.DictReader(out_csv.open()))
    assert [r["kernel"] for r in rows] == ["toy_mm", "TOTAL replayed"]
    assert 0 < float(rows[0]["cost_pct"]) < 100


def test_report_counts_the_configs_tried_failed_ones_included_against_n(table_file, state_dir, tmp_path):
    tune(table_file, state_dir)
    out_csv = tmp_path / "report.csv"
    invoke("report", "--state-dir", str(state_dir), "--csv", str(out_csv))
    row = next(csv.DictReader(out_csv.open()))
    store = StateStore(state_dir)
    state = store.read_listed(store.state_files()[0])
    assert state.failed, "the toy table's failing configs must be among those tried"
    assert int(row["tried"]) == len(state.durations) + len(state.failed)
    assert int(row["N"]) == state.n_configs
    assert float(row["tried_pct"]) == pytest.approx(100.0 * int(row["tried"]) / state.n_configs)


def test_report_totals_live_tunes_apart_from_replayed_ones_whose_seconds_were_never_spent(tmp_path):
    states = tmp_path / "s"
    states.mkdir()
    live = ["v1-live-h200-triton-rmsnorm-fasta-window.fsm", "v1-live-h200-triton-mm_skinny_bf16-fasta.fsm"]
    for name in [*live, "v1-done-exhaustive.fsm"]:
        shutil.copy(CORPUS / name, states / name)
    out_csv = tmp_path / "r.csv"
    assert fasta_sm("report", "--state-dir", str(states), "--csv", str(out_csv)).returncode == 0
    rows = list(csv.DictReader(out_csv.open()))
    assert [r["file"] for r in rows] == [*sorted(live), "", "v1-done-exhaustive.fsm", ""]
    assert (rows[2]["kernel"], rows[4]["kernel"]) == ("TOTAL", "TOTAL replayed")
    assert float(rows[2]["compile_s"]) == pytest.approx(float(rows[0]["compile_s"]) + float(rows[1]["compile_s"]))
    assert float(rows[4]["compile_s"]) == pytest.approx(float(rows[3]["compile_s"]))
    assert (rows[2]["position"], rows[4]["position"]) == ("2 tunes, 2 finished", "1 tune, 1 finished")


def test_report_csv_writes_a_state_file_name_of_undecodable_bytes_escaped_as_the_table_prints_it(tmp_path):
    """A file name that is not UTF-8 is a row like any other: its bytes are escaped, not a traceback at the end."""
    states = tmp_path / "s"
    states.mkdir()
    shutil.copy(CORPUS / "v1-coverage-done.fsm", states / os.fsdecode(b"x\xfe.fsm"))
    out_csv = tmp_path / "r.csv"
    done = fasta_sm("report", "--state-dir", str(states), "--csv", str(out_csv))
    assert done.returncode == 0, done.stderr
    assert list(csv.DictReader(out_csv.open()))[0]["file"] == "x\\udcfe.fsm"


def test_ls_keeps_its_columns_aligned_beside_a_file_name_of_undecodable_bytes(tmp_path):
    """Such a byte prints as `\\udcfe`, six characters: the table must measure the cell as it prints it."""
    states = tmp_path / "s"
    states.mkdir()
    shutil.copy(CORPUS / "v1-coverage-done.fsm", states / os.fsdecode(b"x\xfe.fsm"))
    shutil.copy(CORPUS / "v1-r1-benchmark.fsm", states / "v1-r1-benchmark.fsm")
    rows = fasta_sm("ls", "--state-dir", str(states)).stdout.splitlines()[1:]
    assert [row.index(" fasta seed 0 ") for row in rows] == [rows[0].index(" fasta seed 0 ")] * 2


def test_ls_prints_a_kernel_name_holding_a_newline_escaped_on_its_one_row(tmp_path, state_dir):
    """A replay table names its kernel as it likes; a listing's row must not split at a control character."""
    tune(write_table(tmp_path / "odd.json", kernel="two\nlines\x1b"), state_dir)
    rows = fasta_sm("ls", "--state-dir", str(state_dir)).stdout.splitlines()
    assert len(rows) == 2 and " two\\nlines\\x1b " in rows[1]


def test_report_prints_a_kernel_name_holding_a_newline_escaped_on_its_one_row(tmp_path, state_dir):
    tune(write_table(tmp_path / "odd.json", kernel="two\nlines"), state_dir)
    out = fasta_sm("report", "--state-dir", str(state_dir)).stdout
    assert "two\\nlines" in out and not any(line.strip("│ ").startswith("lines") for line in out.splitlines())


def test_show_prints_a_kernel_name_holding_a_newline_escaped_on_the_kernel_line(tmp_path, state_dir):
    tune(write_table(tmp_path / "odd.json", kernel="two\nlines"), state_dir)
    name = next(state_dir.glob("*.fsm")).name
    lines = fasta_sm("show", name, "--state-dir", str(state_dir)).stdout.splitlines()
    assert next(line for line in lines if line.startswith("kernel")).split()[1] == "two\\nlines"


def test_bench_prints_a_kernel_name_holding_a_newline_escaped_on_its_one_row(tmp_path):
    tables = tmp_path / "tables"
    tables.mkdir()
    write_table(tables / "odd.json", kernel="two\nlines")
    out = fasta_sm("bench", "--tables", str(tables), "--seeds", "1", "--policies", "random").stdout
    assert "two\\nlines" in out and not any(line.strip("│ ").startswith("lines") for line in out.splitlines())


def test_tables_lists_a_table_file_named_with_a_newline_escaped_on_its_one_line(tmp_path):
    tables = tmp_path / "tables"
    tables.mkdir()
    write_table(tables / "two\nlines.json")
    assert fasta_sm("tables", "--tables", str(tables)).stdout.splitlines() == ["two\\nlines"]


def test_report_csv_keeps_a_kernel_name_holding_a_newline_as_it_is(tmp_path, state_dir):
    """CSV quotes a field with a newline: the escape is for a printed row, not for the data the CSV holds."""
    tune(write_table(tmp_path / "odd.json", kernel="two\nlines"), state_dir)
    out_csv = tmp_path / "r.csv"
    invoke("report", "--state-dir", str(state_dir), "--csv", str(out_csv))
    assert list(csv.DictReader(out_csv.open(newline="")))[0]["kernel"] == "two\nlines"


def test_show_finds_a_kernel_by_its_name_as_ls_prints_it_escaped(tmp_path, state_dir):
    tune(write_table(tmp_path / "odd.json", kernel="two\nlines"), state_dir)
    out = invoke("show", "two\\nlines", "--state-dir", str(state_dir))
    assert re.search(r"^kernel +two\\nlines ", out, re.MULTILINE), out


@pytest.mark.parametrize("name", ["x\n.fsm", os.fsdecode(b"x\xfe.fsm")])
def test_show_finds_a_state_file_by_its_name_as_ls_prints_it_escaped(tmp_path, name):
    states = tmp_path / "s"
    states.mkdir()
    shutil.copy(CORPUS / "v1-coverage-done.fsm", states / name)
    printed = fasta_sm("ls", "--state-dir", str(states)).stdout.splitlines()[1].split()[0]
    done = fasta_sm("show", printed, "--state-dir", str(states))
    assert done.returncode == 0, (printed, done.stderr)
    assert next(line for line in done.stdout.splitlines() if line.startswith("file")).endswith(printed)


def test_report_tells_two_tunes_of_one_kernel_apart_by_file_and_policy(table_file, state_dir, tmp_path):
    tune(table_file, state_dir)
    tune(table_file, state_dir, "--seed", "2")
    out_csv = tmp_path / "report.csv"
    invoke("report", "--state-dir", str(state_dir), "--csv", str(out_csv))
    rows = [r for r in csv.DictReader(out_csv.open()) if r["kernel"] == "toy_mm"]
    assert sorted(r["policy"] for r in rows) == ["random seed 0 budget 0.5", "random seed 2 budget 0.5"]
    assert {r["file"] for r in rows} == {p.name for p in state_dir.glob("*.fsm")}


def test_graph_out_named_png_draws_a_png_not_mermaid_text(tmp_path, monkeypatch):
    from fasta_sm import diagram

    drawn = []
    monkeypatch.setattr(diagram, "draw_machine", lambda fmt, out: drawn.append(fmt) or str(out))
    invoke("graph", "--out", str(tmp_path / "machine.png"))
    assert drawn == ["png"]


def test_graph_refuses_an_out_file_whose_name_says_another_format(tmp_path):
    error = refused("graph", "--format", "svg", "--out", str(tmp_path / "machine.png"))
    assert "names a png file" in error and not (tmp_path / "machine.png").exists()


@pytest.mark.parametrize("name", ["machine.pdf", "machine.JPG"])
def test_graph_refuses_an_out_file_named_as_a_picture_it_cannot_draw(name, tmp_path):
    error = refused("graph", "--out", str(tmp_path / name))
    assert name in error and "not" in error and not (tmp_path / name).exists()


def test_graph_prints_mermaid_with_every_state():
    out = invoke("graph")
    assert "stateDiagram" in out and all(name in out for name in ("R1", "R2", "DONE"))


def test_show_plot_writes_a_png(table_file, state_dir, tmp_path):
    tune(table_file, state_dir)
    state_file = next(state_dir.glob("*.fsm"))
    picture = tmp_path / "tune.png"
    invoke("show", str(state_file), "--plot", str(picture), "--state-dir", str(state_dir))
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_graph_draws_a_picture_where_graphviz_is_installed(fmt, tmp_path):
    if shutil.which("dot") is None or importlib.util.find_spec("graphviz") is None:
        pytest.skip("needs Graphviz's dot and the graphviz Python package")
    picture = tmp_path / f"machine.{fmt}"
    invoke("graph", "--format", fmt, "--out", str(picture))
    head = picture.read_bytes()[:200]
    assert head.startswith(b"\x89PNG") if fmt == "png" else b"<svg" in picture.read_bytes()


def test_import_and_help_load_neither_torch_nor_triton():
    probe = (
        "import sys, fasta_sm, fasta_sm.cli\n"
        "from click.testing import CliRunner\n"
        "assert CliRunner().invoke(fasta_sm.cli.main, ['--help']).exit_code == 0\n"
        "print(sorted(m for m in ('torch', 'triton', 'torch_npu') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_dir_of_fasta_sm_lists_autotune_without_loading_triton():
    probe = "import sys, fasta_sm\nprint('autotune' in dir(fasta_sm), 'triton' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]


def fasta_sm(*args: str, env: dict[str, str] | None = None,
             timeout: float | None = None) -> subprocess.CompletedProcess:
    """The installed entry point, as a user runs it (into a pipe): errors handled by `run`, not by the test runner."""
    return subprocess.run([sys.executable, "-c", "from fasta_sm.cli import run; run()", *args], timeout=timeout,
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "", **(env or {})})


def refused(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2, result.output
    return result.output


def only_the_first_config_runs(table_file: Path) -> Path:
    table = json.loads(table_file.read_text())
    for row in table["configs"][1:]:
        row["duration_us"], row["error"] = [], "OutOfResources: shared memory"
    table_file.write_text(json.dumps(table))
    return table_file


def test_a_tune_that_ends_with_no_config_run_says_its_error_in_one_line(table_file, state_dir):
    table = only_the_first_config_runs(table_file)
    done = fasta_sm("tune", "--replay", str(table), "--policy", "random", "--budget", "0.05", "--seed", "1",
                    "--state-dir", str(state_dir))
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("Error: ") and "no config ran" in lines[0]


def test_a_verbose_tune_that_ends_with_no_config_run_still_logs_the_state_kept(table_file, state_dir):
    table = only_the_first_config_runs(table_file)
    done = fasta_sm("-v", "tune", "--replay", str(table), "--policy", "random", "--budget", "0.05", "--seed", "1",
                    "--state-dir", str(state_dir))
    assert done.returncode == 1 and "state kept at the last checkpoint" in done.stderr


def test_a_seed_past_64_bits_is_a_usage_error(table_file, state_dir):
    error = refused("tune", "--replay", str(table_file), "--state-dir", str(state_dir), "--seed", str(2**64))
    assert "--seed" in error and not state_dir.exists()


def test_bench_refuses_seeds_that_run_past_64_bits_before_any_run(table_file):
    error = refused("bench", "--tables", str(table_file.parent), "--seed-start", str(2**64 - 1), "--seeds", "2")
    assert "--seed-start" in error and "the largest seed" in error


def test_bench_blames_seeds_alone_when_only_seeds_runs_past_64_bits(table_file):
    error = refused("bench", "--tables", str(table_file.parent), "--seeds", str(2**64 + 1))
    assert "--seeds" in error and "--seed-start" not in error


def test_bench_refuses_to_write_its_json_among_the_tables_the_next_bench_reads(table_file):
    out = table_file.parent / "results.json"
    error = refused("bench", "--tables", str(table_file.parent), "--seeds", "1", "--policies", "random",
                    "--json", str(out))
    assert "--json" in error and "tables folder" in error and not out.exists()


@pytest.mark.parametrize("how", ["dot-dot", "link"])
def test_bench_refuses_its_json_in_the_tables_folder_however_the_path_is_written(how, table_file, tmp_path):
    folder = table_file.parent
    if how == "link":
        (tmp_path.parent / f"{tmp_path.name}-link").symlink_to(folder)
        tables, out = tmp_path.parent / f"{tmp_path.name}-link", folder / "results.json"
    else:
        tables, out = folder, folder / ".." / folder.name / "results.json"
    error = refused("bench", "--tables", str(tables), "--seeds", "1", "--policies", "random", "--json", str(out))
    assert "tables folder" in error and not out.exists()


def test_kernel_names_print_as_they_are_with_emoji_codes_left_alone(tmp_path, state_dir):
    table = write_table(tmp_path / "colon.json", kernel="gemm:b:fp16")
    assert "kernel         gemm:b:fp16" in tune(table, state_dir)
    assert "gemm:b:fp16" in invoke("ls", "--state-dir", str(state_dir))
    assert "gemm:b:fp16" in invoke("show", "--state-dir", str(state_dir), "gemm:b:fp16")


def test_a_bench_json_that_cannot_be_written_is_named_in_the_error(table_file, tmp_path, monkeypatch):
    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    out = tmp_path / "out" / "bench.json"
    out.parent.mkdir()
    result = CliRunner().invoke(main, ["bench", "--tables", str(table_file.parent), "--seeds", "1", "--policies",
                                       "random", "--json", str(out)])
    assert result.exit_code == 1 and f"--json {out}: No space left on device" in result.output


def test_a_plot_that_cannot_be_written_is_named_in_the_error(tmp_path, monkeypatch):
    """A full disk's own message names neither the file nor its option, as for `--json` above."""
    figure = pytest.importorskip("matplotlib.figure")

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(figure.Figure, "savefig", full_disk)
    out = tmp_path / "p.png"
    result = CliRunner().invoke(main, ["show", str(CORPUS / "v1-coverage-done.fsm"), "--plot", str(out)])
    assert result.exit_code == 1 and f"--plot {out}: No space left on device" in result.output


def test_an_output_file_in_a_directory_this_process_cannot_write_is_refused_before_any_work(table_file, tmp_path,
                                                                                           monkeypatch):
    unwritable = tmp_path / "read-only"
    unwritable.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != unwritable and real_access(path, mode))
    result = CliRunner().invoke(main, ["bench", "--tables", str(table_file.parent), "--seeds", "1",
                                       "--json", str(unwritable / "out.json")])
    assert result.exit_code == 1 and f"directory {unwritable} is not writable" in result.output
    assert "Per kernel" not in result.output


def test_what_a_command_wrote_is_said_on_standard_error_so_its_output_stays_the_table(table_file, state_dir,
                                                                                      tmp_path):
    tune(table_file, state_dir)
    csv_out = tmp_path / "report.csv"
    done = fasta_sm("report", "--state-dir", str(state_dir), "--csv", str(csv_out))
    assert done.returncode == 0 and f"wrote {csv_out}" not in done.stdout and f"wrote {csv_out}" in done.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
def test_ls_answers_when_a_lock_file_is_a_named_pipe(table_file, state_dir):
    tune(table_file, state_dir)
    (lock,) = state_dir.glob("*.lock")
    lock.unlink()
    os.mkfifo(lock)
    done = fasta_sm("ls", "--state-dir", str(state_dir), timeout=60)
    assert done.returncode == 0 and "toy_mm" in done.stdout


def test_bench_needs_at_least_one_seed(table_file):
    assert "--seeds" in refused("bench", "--tables", str(table_file.parent), "--seeds", "0")


def test_bench_refuses_a_policy_named_twice(table_file):
    assert "--policies" in refused("bench", "--tables", str(table_file.parent), "--policies", "random,random")


def test_bench_refuses_a_param_the_policy_does_not_know_naming_it(table_file):
    error = refused("bench", "--tables", str(table_file.parent), "--seeds", "1", "--param", "nonsense=1")
    assert "--param" in error and "nonsense" in error


@pytest.mark.parametrize(("policy", "takes"), [("random", "no parameter"), ("trees", "r1_frac, rounds, kappa")])
def test_bench_refuses_a_baseline_param_naming_the_knobs_it_takes_its_budget_apart(policy, takes, table_file):
    error = refused("bench", "--tables", str(table_file.parent), "--seeds", "1", "--policies", policy,
                    "--param", "nonsense=1")
    assert f"policy {policy!r} takes {takes} here (its budget is --budget); got 'nonsense'" in error


def test_bench_refuses_a_param_without_a_value(table_file):
    error = refused("bench", "--tables", str(table_file.parent), "--seeds", "1", "--param", "failure_fit")
    assert "NAME=VALUE" in error


def test_bench_takes_param_values_as_json_or_python_literals(table_file):
    for value in ("failure_fit=true", "failure_fit=True", "retime_rank=lower", "retime_rank='lower'"):
        invoke("bench", "--tables", str(table_file.parent), "--seeds", "1", "--policies", "fasta", "--param", value)


def test_bench_refuses_a_param_that_a_later_table_rejects_before_any_run(tmp_path):
    write_table(tmp_path / "a_big.json")
    small = json.loads(write_table(tmp_path / "b_small.json").read_text())
    small["configs"] = small["configs"][:10]
    (tmp_path / "b_small.json").write_text(json.dumps(small))
    error = refused("bench", "--tables", str(tmp_path), "--seeds", "1", "--policies", "fasta",
                    "--param", "expert_configs=[20]")
    assert "b_small.json" in error and "expert_configs" in error


def test_bench_refuses_a_budget_param_pointing_to_budget(table_file):
    error = refused("bench", "--tables", str(table_file.parent), "--seeds", "1", "--param", "budget=0.1")
    assert "--budget" in error


def test_bench_refuses_a_param_given_twice(table_file):
    error = refused("bench", "--tables", str(table_file.parent), "--seeds", "1",
                    "--param", "failure_fit=true", "--param", "failure_fit=false")
    assert "twice" in error


def test_tune_refuses_a_negative_seed(table_file, state_dir):
    assert "--seed" in refused("tune", "--replay", str(table_file), "--seed", "-3", "--state-dir", str(state_dir))


def test_bench_on_a_missing_tables_dir_is_one_line_naming_it(tmp_path):
    done = fasta_sm("bench", "--tables", str(tmp_path / "nowhere"), "--seeds", "1")
    assert done.returncode == 1 and "nowhere" in done.stderr and "Traceback" not in done.stderr


def test_errors_of_fasta_sm_and_of_click_share_one_prefix(tmp_path, table_file):
    ours = fasta_sm("bench", "--tables", str(tmp_path / "nowhere"), "--seeds", "1")
    clicks = fasta_sm("bench", "--tables", str(table_file.parent), "--seeds", "0")
    assert ours.stderr.startswith("Error: ") and (ours.returncode, clicks.returncode) == (1, 2)
    assert clicks.stderr.splitlines()[-1].startswith("Error: ")


def test_bench_on_a_dir_without_tables_is_one_line_naming_it(tmp_path):
    done = fasta_sm("bench", "--tables", str(tmp_path), "--seeds", "1")
    assert done.returncode == 1 and "no *.json replay tables" in done.stderr and "Traceback" not in done.stderr


def test_bench_refuses_exhaustive_as_a_policy_saying_why(table_file):
    result = CliRunner().invoke(main, ["bench", "--tables", str(table_file.parent), "--policies", "fasta,exhaustive"])
    assert result.exit_code == 2 and "yardstick" in result.output and "Traceback" not in result.output


def test_bench_tells_two_tables_of_one_kernel_apart_by_file(table_file, tmp_path):
    table = json.loads(table_file.read_text())
    table["device"] = "another GPU"
    (tmp_path / "other.json").write_text(json.dumps(table))
    (tmp_path / "results").mkdir()
    out = tmp_path / "results" / "bench.json"
    invoke("bench", "--tables", str(tmp_path), "--seeds", "1", "--policies", "random", "--json", str(out))
    rows = json.loads(out.read_text())["kernels"]
    assert sorted(row["kernel"] for row in rows) == ["toy_mm (other.json)", f"toy_mm ({table_file.name})"]


def test_bench_sets_the_leader_against_the_best_baseline_overall_and_on_each_needle(table_file, tmp_path):
    table_file.unlink()
    for kernel, first in (("toy_needle", 50.0), ("toy_flat", 100.0)):  # one config near the best, or all of them
        data = json.loads(write_table(tmp_path / "toy.json").read_text())
        data["kernel"] = kernel
        for position, row in enumerate(data["configs"]):
            if row["error"] is None:
                row["duration_us"] = [first, first] if position == 0 else [100.0, 100.5]
        (tmp_path / f"{kernel}.json").write_text(json.dumps(data))
    (tmp_path / "toy.json").unlink()
    out = invoke("bench", "--tables", str(tmp_path), "--seeds", "1", "--policies", "fasta,random")
    against = out[out.index("Against the best baseline"):]
    assert re.search(r"overall\s+│\s+[\d.]+\s+│\s+random", against)
    assert "toy_needle" in against and "toy_flat" not in against


def test_bench_calls_equal_overall_catch2s_tied_though_their_float_sums_differ(monkeypatch):
    import fasta_sm.bench

    def bench(_folder, names, _seeds, **_):  # 10 seeds: fasta catches 1 and 2, random 3 and 0, 0.15 both
        rows = [{"kernel": kernel, "policy": policy, "N": 10, "catch2": catch2}
                for kernel, catches in (("a", (0.1, 0.3)), ("b", (0.2, 0.0))) for policy, catch2 in zip(names, catches)]
        columns = ("catch2", "catch5", "median_regret_pct", "p95_regret_pct", "evals_pct", "cost_pct")
        for row in rows:
            row.update({c: row["catch2"] for c in columns})
        return {"kernels": rows, "overall": {p: {c: float(np.mean([r[c] for r in rows if r["policy"] == p]))
                                                 for c in columns} for p in names}}

    monkeypatch.setattr(fasta_sm.bench, "bench", bench)
    monkeypatch.setattr(fasta_sm.bench, "needle_labels", lambda _loaded: [])
    out = invoke("bench", "--seeds", "10", "--policies", "fasta,random")
    assert re.search(r"overall\s+│\s+0\.150\s+│\s+random\s+│\s+0\.150\s+│\s+tied", out), out


def test_bench_reads_each_table_once_for_its_checks_runs_and_needles(table_file, monkeypatch):
    """Its figures and its notes must come from one reading of each file, even one a recorder rewrites meanwhile."""
    reads = []
    read_text = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda path, *a, **kw: reads.append(path) or read_text(path, *a, **kw))
    invoke("bench", "--tables", str(table_file.parent), "--seeds", "1", "--policies", "fasta,random",
           "--param", "min_budget=13")
    assert reads == [table_file]


def test_bench_json_writes_null_for_a_regret_no_run_could_measure(table_file, tmp_path):
    table = json.loads(table_file.read_text())
    for row in table["configs"][1:]:
        row["duration_us"], row["error"] = [], "OutOfResources: shared memory"
    table_file.write_text(json.dumps(table))
    (tmp_path / "results").mkdir()
    out = tmp_path / "results" / "bench.json"
    invoke("bench", "--tables", str(table_file.parent), "--seeds", "4", "--policies", "random", "--budget", "0.05",
           "--json", str(out))
    text = out.read_text()
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text)["kernels"][0]["p95_regret_pct"] is None


def test_two_tables_of_one_kernel_name_are_two_tunes(table_file, tmp_path, state_dir):
    table = json.loads(table_file.read_text())
    table["device"] = "another GPU"
    (tmp_path / "other").mkdir()
    second = tmp_path / "other" / table_file.name
    second.write_text(json.dumps(table))
    tune(table_file, state_dir)
    assert "reused" not in tune(second, state_dir)


def test_show_of_a_tune_where_no_config_ran_says_so_instead_of_an_empty_table(tmp_path, state_dir):
    shown = invoke("show", str(tune_where_nothing_compiles(tmp_path, state_dir)))
    assert "Measured: none (no config ran)" in shown and "Measured, fastest first" not in shown


def test_show_plot_in_an_unknown_format_is_a_clear_error(table_file, state_dir, tmp_path):
    tune(table_file, state_dir)
    state_file = next(state_dir.glob("*.fsm"))
    result = CliRunner().invoke(main, ["show", str(state_file), "--plot", str(tmp_path / "p.txt")])
    assert result.exit_code == 2 and "--plot" in result.output and "p.txt: name a file ending in .png or .svg" in \
        result.output and not (tmp_path / "p.txt").exists()


def test_show_plot_of_a_tune_that_timed_nothing_says_so_and_draws_nothing(tmp_path):
    picture = tmp_path / "p.png"
    result = CliRunner().invoke(main, ["show", str(CORPUS / "v1-r1-compile.fsm"), "--plot", str(picture)])
    assert result.exit_code == 1 and "nothing is timed yet (R1 compile)" in result.output and not picture.exists()


def test_show_plot_of_a_tune_that_ended_with_no_config_run_says_so_not_that_nothing_is_timed_yet(tmp_path, state_dir):
    picture = tmp_path / "p.png"
    result = CliRunner().invoke(main, ["show", str(tune_where_nothing_compiles(tmp_path, state_dir)),
                                       "--plot", str(picture)])
    assert result.exit_code == 1 and "the tune stopped with no config run" in result.output
    assert "nothing is timed yet" not in result.output and not picture.exists()


@pytest.mark.parametrize("make", [Path.mkdir, lambda path: path.symlink_to(path.parent / "nowhere")],
                         ids=["a directory", "a link to nothing"])
def test_show_of_an_entry_ls_lists_as_unreadable_says_what_ls_says_naming_it(make, state_dir):
    state_dir.mkdir()
    make(state_dir / "dddd.fsm")
    listed = fasta_sm("ls", "--state-dir", str(state_dir)).stdout
    shown = fasta_sm("show", "dddd.fsm", "--state-dir", str(state_dir))
    said = shown.stderr.strip().removeprefix("Error: ")
    assert shown.returncode == 1 and said.startswith(f"{state_dir / 'dddd.fsm'}: unreadable (")
    assert said.removeprefix(f"{state_dir / 'dddd.fsm'}: ") in listed


def test_ls_says_once_why_it_cannot_read_a_file_and_leaves_its_path_to_the_file_column(state_dir):
    state_dir.mkdir()
    (state_dir / "dddd.fsm").mkdir()
    (state_dir / "eeee.fsm").write_bytes(b"x")
    listed = fasta_sm("ls", "--state-dir", str(state_dir)).stdout
    assert "unreadable (it is a directory, not a state file)" in listed and "unreadable: unreadable" not in listed
    assert "unreadable: top level is int, expected a map" in listed and str(state_dir) not in listed


def test_show_json_with_a_plot_keeps_standard_output_json(table_file, state_dir, tmp_path):
    pytest.importorskip("matplotlib")
    tune(table_file, state_dir)
    state_file = next(state_dir.glob("*.fsm"))
    done = fasta_sm("show", str(state_file), "--json", "--plot", str(tmp_path / "p.png"))
    assert json.loads(done.stdout)["format"] == "fasta-sm.show/1" and "wrote" in done.stderr


def test_show_a_missing_file_names_that_file(state_dir, tmp_path):
    result = CliRunner().invoke(main, ["show", str(tmp_path / "gone.fsm"), "--state-dir", str(state_dir)])
    assert result.exit_code == 1 and "gone.fsm" in result.output and "looked for" not in result.output


def test_a_plot_into_a_missing_dir_is_refused_as_the_other_outputs_are(table_file, state_dir, tmp_path):
    tune(table_file, state_dir)
    (state_file,) = state_dir.glob("*.fsm")
    done = fasta_sm("show", str(state_file), "--plot", str(tmp_path / "no" / "p.png"))
    assert done.returncode == 1 and f"--plot {tmp_path / 'no' / 'p.png'}: no directory" in done.stderr


def test_graph_as_a_picture_needs_an_output_file():
    assert "--out" in refused("graph", "--format", "png")


def test_report_to_a_missing_dir_is_one_line_naming_the_file(table_file, state_dir, tmp_path):
    tune(table_file, state_dir)
    done = fasta_sm("report", "--state-dir", str(state_dir), "--csv", str(tmp_path / "no" / "r.csv"))
    assert done.returncode == 1 and "r.csv" in done.stderr and "Traceback" not in done.stderr


CORPUS = Path(__file__).resolve().parents[2] / "states"


def test_square_brackets_in_an_error_print_as_they_are(tmp_path):
    bad = tmp_path / "[bench].json"
    bad.write_text("{not json")
    done = fasta_sm("tune", "--replay", str(bad), "--state-dir", str(tmp_path / "s"))
    assert done.returncode == 1 and "[bench].json" in done.stderr


def test_reading_commands_never_create_a_missing_state_dir(tmp_path):
    missing = tmp_path / "typo" / "dir"
    for command in ("ls", "report"):
        result = CliRunner().invoke(main, [command, "--state-dir", str(missing)])
        assert result.exit_code == 1 and "no state dir" in result.output
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize("variable", [None, "", "  "], ids=["unset", "empty", "blanks"])
def test_reading_commands_on_a_first_run_say_there_are_no_tunes_yet(variable, tmp_path, monkeypatch):
    if variable is None:
        monkeypatch.delenv("FASTA_SM_STATE_DIR", raising=False)
    else:
        monkeypatch.setenv("FASTA_SM_STATE_DIR", variable)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for command in ("ls", "report"):
        result = CliRunner().invoke(main, [command])
        assert result.exit_code == 0 and "no tunes yet" in result.output, result.output
    assert not (tmp_path / "cache").exists()


def test_report_on_a_first_run_still_writes_its_csv_as_an_empty_state_dir_does(tmp_path, monkeypatch):
    """A script that runs `report --csv` and reads the file must not find it missing after exit 0."""
    monkeypatch.delenv("FASTA_SM_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    empty = tmp_path / "empty"
    empty.mkdir()
    for name, args in (("first.csv", []), ("empty.csv", ["--state-dir", str(empty)])):
        result = CliRunner().invoke(main, ["report", "--csv", str(tmp_path / name), *args])
        assert result.exit_code == 0, result.output
    assert (tmp_path / "first.csv").read_text() == (tmp_path / "empty.csv").read_text()
    result = CliRunner().invoke(main, ["report", "--csv", str(tmp_path / "no" / "such" / "dir.csv")])
    assert result.exit_code == 1 and "--csv" in result.output, result.output  # a bad --csv is refused all the same


def test_a_missing_state_dir_named_by_the_environment_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTA_SM_STATE_DIR", str(tmp_path / "typo"))
    result = CliRunner().invoke(main, ["ls"])
    assert result.exit_code == 1 and "no state dir" in result.output


def test_show_in_a_state_dir_named_by_the_environment_that_is_a_file_says_it_is_not_a_directory(tmp_path,
                                                                                                 monkeypatch):
    afile = tmp_path / "states"
    afile.write_text("")
    monkeypatch.setenv("FASTA_SM_STATE_DIR", str(afile))
    result = CliRunner().invoke(main, ["show", "some-kernel"])
    assert result.exit_code == 1 and f"(no state dir {afile} (it is not a directory))" in result.output


def test_show_lists_the_configs_an_unfinished_round_still_has_to_time():
    out = invoke("show", str(CORPUS / "v1-handler-error.fsm"))
    assert "not finished" in out and "#126, #180" in out


def test_show_says_which_configs_of_an_unfinished_round_are_not_compiled_yet(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = invoke("show", str(CORPUS / "v1-r2-benchmark-compiling.fsm"))
    assert "(0 timed, 0 failed); 4 to time: compiled: #183; not compiled yet: #126, #129, #180" in out


def test_show_gives_the_prediction_made_when_a_config_was_picked_beside_the_final_one(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = invoke("show", str(CORPUS / "v1-handler-error.fsm"), "--top", "1")
    assert "pred @ pick" in out and "176.27 µs" in out and "225.01 µs" in out


def _round_row(out: str, name: str) -> list[str]:
    """The cells of the first row of `show`'s tables that starts with `name` (a round's, in the Rounds table)."""
    row = next(line for line in out.splitlines() if line.startswith(f"│ {name}"))
    return [cell.strip() for cell in row.strip("│ ").split("│")]


def test_show_names_the_configs_each_re_time_round_timed_again(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = invoke("show", str(CORPUS / "v1-done-retime-contenders.fsm"))
    assert _round_row(out, "R2_10")[:3] == ["R2_10 (re-time)", "2",
                                            "fasta: budget spent; re-timing the 2 near-best: #185, #189"]


def test_show_folds_re_time_rounds_that_timed_the_same_configs_into_one_row_with_their_costs_summed(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = invoke("show", str(CORPUS / "v1-done-retime-contenders.fsm"))
    cells = _round_row(out, "R2_18")
    assert cells[:3] == ["R2_18–R2_19 (re-time ×2)", "3 each",
                         "fasta: budget spent; re-timing the 3 near-best: #149, #185, #190"]
    assert cells[4] == "0.75" and "│ R2_19" not in out


def test_show_heads_a_rounds_policy_time_as_spent_after_it_choosing_the_next_round():
    out = invoke("show", str(CORPUS / "v1-done-with-failures.fsm"))
    header = next(line for line in out.splitlines() if line.startswith("┃ round"))
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")][-1] == "policy ms (after)"


def test_show_needs_a_positive_top():
    assert "--top" in refused("show", str(CORPUS / "v1-handler-error.fsm"), "--top", "0")


def test_verbose_logs_fasta_sm_steps_not_the_state_machine_librarys(table_file, tmp_path):
    done = fasta_sm("-v", "tune", "--replay", str(table_file), "--state-dir", str(tmp_path / "s"))
    assert done.returncode == 0 and "Executed callback" not in done.stderr


def test_report_counts_no_savings_for_unfinished_tunes_and_names_unreadable_files(tmp_path):
    states = tmp_path / "s"
    states.mkdir()
    shutil.copy(CORPUS / "v1-handler-error.fsm", states / "a.fsm")
    (states / "b.fsm").write_bytes(b"garbage")
    out_csv = tmp_path / "r.csv"
    done = fasta_sm("report", "--state-dir", str(states), "--csv", str(out_csv))
    assert done.returncode == 0 and "b.fsm" in done.stderr
    rows = list(csv.DictReader(out_csv.open()))
    assert rows[0]["saved_s"] == "" and float(rows[1]["saved_s"]) == 0.0


def _report_row_of_corpus_file(name: str, tmp_path: Path) -> tuple[dict[str, str], TuneState]:
    """`report --csv`'s row for one corpus state file alone in a state dir, and that state."""
    states = tmp_path / "s"
    states.mkdir()
    shutil.copy(CORPUS / name, states / "a.fsm")
    out_csv = tmp_path / "r.csv"
    assert fasta_sm("report", "--state-dir", str(states), "--csv", str(out_csv)).returncode == 0
    return next(csv.DictReader(out_csv.open())), StateStore.read(states / "a.fsm")


def test_report_estimates_compile_seconds_per_config_compiled_not_per_config_tried(tmp_path):
    """Mid-R1 benchmark: configs compiled but not yet timed are not `tried`, and their compiles are in `compile_s`."""
    row, state = _report_row_of_corpus_file("v1-r1-benchmark.fsm", tmp_path)
    compiled = len(set(state.compiled) | set(state.failed))
    assert int(row["tried"]) == len(state.durations) + len(state.failed) < compiled
    per_config = float(row["compile_s"]) / compiled * state.n_configs
    assert per_config <= float(row["exhaustive_s"]) < float(row["compile_s"]) / int(row["tried"]) * state.n_configs


def test_report_counts_carried_configs_as_tried_though_they_cost_the_tune_nothing(tmp_path):
    row, state = _report_row_of_corpus_file("v3-done-carried.fsm", tmp_path)
    assert state.carried_taken, "the corpus file must hold results taken from a superseded tune"
    assert int(row["tried"]) == len(state.durations) + len(state.failed)
    assert float(row["tried_pct"]) > 2 * float(row["cost_pct"])


def test_report_leaves_the_cost_of_a_tune_that_compiled_nothing_blank_not_zero_or_nan(tmp_path):
    states = tmp_path / "s"
    states.mkdir()
    shutil.copy(CORPUS / "v1-r1-compile.fsm", states / "a.fsm")
    out_csv = tmp_path / "r.csv"
    done = fasta_sm("report", "--state-dir", str(states), "--csv", str(out_csv))
    row = next([cell.strip() for cell in line.split("│")[1:-1]] for line in done.stdout.splitlines() if "a.fsm" in line)
    assert done.returncode == 0 and "nan" not in done.stdout and row[-3:] == ["-", "-", "-"]
    assert [(row["exhaustive_s"], row["cost_pct"]) for row in csv.DictReader(out_csv.open())] == [("", "")] * 2


def test_report_into_a_pipe_keeps_a_long_kernel_name_whole(tmp_path, state_dir):
    name = "triton_poi_fused_native_layer_norm_gelu_" + "x" * 120
    tune(write_table(tmp_path / "long.json", kernel=name), state_dir)
    assert name in fasta_sm("report", "--state-dir", str(state_dir)).stdout


def test_report_on_a_terminal_narrower_than_the_table_cuts_no_cell(tmp_path, state_dir, monkeypatch):
    from rich.console import Console

    import fasta_sm.cli

    name = "triton_poi_fused_native_layer_norm_gelu_" + "x" * 40
    tune(write_table(tmp_path / "long.json", kernel=name), state_dir)
    monkeypatch.setattr(fasta_sm.cli, "console", Console(force_terminal=True, width=80))
    out = invoke("report", "--state-dir", str(state_dir))
    assert name in out and "…" not in out


def _interrupted(*_args, **_kwargs):
    raise KeyboardInterrupt


def test_ctrl_c_in_a_tune_exits_130_saying_the_same_command_resumes_it(monkeypatch, capsys, table_file, state_dir):
    import fasta_sm.tuner

    monkeypatch.setattr(fasta_sm.tuner, "tune", _interrupted)
    monkeypatch.setattr(sys, "argv", ["fasta-sm", "tune", "--replay", str(table_file), "--state-dir", str(state_dir)])
    with pytest.raises(SystemExit) as exit_:
        run()
    assert exit_.value.code == 130
    assert "interrupted: the tune keeps every step it finished, and the same command resumes it" in (
        capsys.readouterr().err
    )


def test_ctrl_c_in_a_command_that_keeps_no_state_exits_130_promising_nothing(monkeypatch, capsys, table_file):
    import fasta_sm.bench

    monkeypatch.setattr(fasta_sm.bench, "bench", _interrupted)
    monkeypatch.setattr(sys, "argv", ["fasta-sm", "bench", "--tables", str(table_file.parent), "--seeds", "1"])
    with pytest.raises(SystemExit) as exit_:
        run()
    assert exit_.value.code == 130 and "resume" not in capsys.readouterr().err


def test_tables_stats_names_each_table_by_its_file_as_the_plain_listing_does(table_file):
    shutil.copy(table_file, table_file.parent / "toy_mm_other_device.json")
    done = fasta_sm("tables", "--stats", "--tables", str(table_file.parent))
    names = [line.split("│")[1].strip() for line in done.stdout.splitlines() if "toy_mm" in line]
    assert names == ["toy_mm", "toy_mm_other_device"]


@pytest.mark.parametrize("stats", [False, True], ids=["names", "stats"])
def test_tables_lists_the_readable_tables_then_fails_naming_an_unreadable_one(table_file, stats):
    (table_file.parent / "junk.json").write_text('{"x": 1}')
    done = fasta_sm("tables", *(["--stats"] if stats else []), "--tables", str(table_file.parent))
    assert done.returncode == 1 and "toy_mm" in done.stdout
    assert "junk.json: missing field 'kernel'" in done.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
def test_tables_lists_the_readable_tables_then_fails_naming_a_named_pipe_among_them_unopened(table_file):
    os.mkfifo(table_file.parent / "pipe.json")
    done = fasta_sm("tables", "--tables", str(table_file.parent), timeout=60)
    assert done.returncode == 1 and "toy_mm" in done.stdout and "pipe.json: not a regular file" in done.stderr


def test_tune_replays_a_table_a_pipe_feeds_as_process_substitution_gives_one(table_file, state_dir):
    done = subprocess.run(["bash", "-c", '"$0" -c "from fasta_sm.cli import run; run()" tune --replay <(cat "$1") '
                           '--state-dir "$2"', sys.executable, str(table_file), str(state_dir)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "toy_mm" in done.stdout, done.stderr


@pytest.mark.parametrize("command", ["tables", "bench"])
def test_hidden_files_among_the_tables_are_left_out(table_file, command):
    (table_file.parent / ".#toy_mm.json").symlink_to("user@host.1234")  # an editor's lock on the table
    (table_file.parent / "._toy_mm.json").write_bytes(b"\x00\x05\x16\x07")  # macOS metadata beside a copy
    extra = ["--seeds", "1", "--policies", "random"] if command == "bench" else []
    done = fasta_sm(command, "--tables", str(table_file.parent), *extra)
    assert done.returncode == 0 and "toy_mm" in done.stdout and done.stderr == ""


def test_the_shipped_tables_are_listed_without_hidden_files(table_file, monkeypatch):
    """`tables` with no option lists the package's own folder: an editor's lock there (an editable install) is no
    table, as `tables --stats` and `bench` already leave it out."""
    import fasta_sm.data

    (table_file.parent / ".#toy_mm.json").symlink_to("user@host.1234")
    monkeypatch.setattr(fasta_sm.data, "tables_dir", lambda: table_file.parent)
    assert invoke("tables").split() == ["toy_mm"]
    refused = CliRunner().invoke(main, ["tune", "--replay", "no_such_table"])
    assert str(refused.exception).endswith("not a file, nor one of toy_mm")


def test_record_help_says_a_limit_at_or_past_the_space_records_it_whole_under_its_own_name():
    """As docs/cli.md says and `record.spread` does: only a true subset is named `<name>_subsetN`."""
    shown = " ".join(invoke("record", "--help").split())
    assert "as the kernel <name>_subsetN; an N at or past the space's size records the whole space, as <name>." in shown


def test_output_files_in_a_missing_directory_are_refused_before_any_work(tmp_path, table_file):
    done = fasta_sm("bench", "--tables", str(table_file.parent), "--seeds", "1", "--policies", "random",
                    "--json", str(tmp_path / "no" / "x.json"))
    assert done.returncode == 1 and "no directory" in done.stderr and "Per kernel" not in done.stdout
    done = fasta_sm("graph", "--out", str(tmp_path / "no" / "g.mmd"))
    assert done.returncode == 1 and not (tmp_path / "no").exists()


def test_a_policy_given_parameters_it_does_not_take_says_which_it_takes(table_file, state_dir):
    done = fasta_sm("tune", "--replay", str(table_file), "--policy", "exhaustive", "--budget", "0.1",
                    "--state-dir", str(state_dir))
    assert done.returncode == 2 and "policy 'exhaustive' takes no parameters" in done.stderr
    assert "--budget" in done.stderr and not state_dir.exists()


def test_record_without_torch_is_a_one_line_error_saying_what_to_install(tmp_path):
    code = "import sys; sys.modules['torch'] = None; from fasta_sm.cli import run; run()"
    done = subprocess.run([sys.executable, "-c", code, "record", "softmax", "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("Error: fasta-sm record needs torch and Triton") and "pip install" in done.stderr


def test_record_refuses_a_limit_below_one():
    assert "--limit" in refused("record", "rmsnorm", "--out", "x", "--limit", "0")


def test_show_does_not_list_the_callers_params_as_unlike_todays_defaults(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    head = invoke("show", str(CORPUS / "v1-live-h200-triton-rmsnorm-fasta-window.fsm")).split("backend")[0]
    unlike = re.search(r"unlike today's defaults: ([^\n]*)", head)
    assert "{'retime_rounds': 6, 'retime_cost': 0.05}" in head
    assert unlike is None or "retime_" not in unlike.group(1)  # a default changed since is listed; the caller's not
    assert "retime_rank" in invoke("show", str(CORPUS / "v1-done-polish-rules.fsm")).split("backend")[0]


def test_show_names_the_inner_policys_stored_params_for_an_integrations_tune(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = invoke("show", str(CORPUS / "v1-live-h200-inductor-gelu.fsm"))
    assert "stored params unlike today's defaults: small_budget=0.21" in out


def test_show_does_not_count_configs_that_failed_to_compile_as_still_to_time(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = invoke("show", str(CORPUS / "v1-r1-benchmark.fsm"))
    assert "(4 timed, 2 failed); 7 to time" in out


class FailsAtRunTime(ReplayBackend):
    """A replay whose configs that `fails` names compile, then fail when timed."""

    def __init__(self, table, fails: Callable) -> None:
        super().__init__(table)
        self.fails = fails

    def benchmark(self, configs, repeat=None):
        out = super().benchmark(configs, repeat)
        durations = [math.inf if self.fails(c) else d for c, d in zip(configs, out.durations_us)]
        errors = {p: "RuntimeError: illegal memory access" for p, c in enumerate(configs) if self.fails(c)}
        return BenchmarkOutcome(durations, out.seconds, {**out.errors, **errors})


def test_show_does_not_count_a_config_that_failed_at_run_time_as_timed(tmp_path, state_dir, monkeypatch):
    # a config that fails at run time is in round_done (its turn to be timed is over) and in failed: counted as
    # timed too, a batch of 9 read "(8 timed, 1 failed); 1 to time"
    monkeypatch.setenv("COLUMNS", "200")
    table = load_table(write_table(tmp_path / "toy_mm.json", fail_big=False))

    store = StateStore(state_dir)
    with store.lock("k", "toy_mm"):
        backend = FailsAtRunTime(table, lambda c: c.num_warps == 8)
        tune_ = open_tune(store, "k", "toy_mm", table.configs, backend, benchmark_chunk=1)
        state = tune_.drive(until=lambda s: s.step == "benchmark" and s.untimed()
                            and any(i in s.failed and i in s.compiled for i in s.round_done))
        tune_.close()
    failed = set(state.pending) & set(state.failed)
    timed = len(set(state.round_done) - failed)
    assert timed + len(failed) + len(state.untimed()) == len(state.pending)
    out = " ".join(invoke("show", "k", "--state-dir", str(state_dir)).split())
    assert f"({timed} timed, {len(failed)} failed); {len(state.untimed())} to time" in out


def test_report_counts_the_seconds_of_failed_runs_in_the_exhaustive_estimate(tmp_path, state_dir):
    # an exhaustive tune of configs that all compile and fail when timed spent what exhaustive tuning spends; the
    # estimate divided its benchmark seconds by no timing and multiplied them by no config: 117.37 % of exhaustive
    table = load_table(write_table(tmp_path / "toy_mm.json", fail_big=False))
    with pytest.raises(TuneFailed, match="no config ran"):
        api_tune("k", "toy_mm", table.configs, FailsAtRunTime(table, lambda c: True), policy="exhaustive",
                 store=StateStore(state_dir))
    out_csv = tmp_path / "report.csv"
    invoke("report", "--csv", str(out_csv), "--state-dir", str(state_dir))
    row = next(csv.DictReader(out_csv.open()))
    assert float(row["benchmark_s"]) > 0 and float(row["cost_pct"]) == pytest.approx(100)


def test_tables_stats_says_what_each_table_holds(table_file):
    done = fasta_sm("tables", "--stats", "--tables", str(table_file.parent))
    row = next(line.split("│") for line in done.stdout.splitlines() if "toy_mm" in line)
    cells = [cell.strip() for cell in row if cell.strip()]
    assert cells == ["toy_mm", "48", "3", "0.72", "102.00 µs", "2", "2", "1.01 % / 1.0 %"]


def _edited(table_file: Path, edit: Callable[[dict], None]) -> Path:
    """The toy table file, rewritten after `edit` changed its JSON object in place."""
    table = json.loads(table_file.read_text())
    edit(table)
    table_file.write_text(json.dumps(table))
    return table_file


def _with_cache_hits(table_file: Path, hits: int) -> Path:
    """The toy table with its first `hits` compile times those of loads from Triton's cache."""

    def load_from_cache(table: dict) -> None:
        for row in table["configs"][:hits]:
            row["compile_s"] = 0.004

    return _edited(table_file, load_from_cache)


def test_tables_stats_notes_a_table_whose_compile_times_are_cache_hits(table_file):
    done = fasta_sm("tables", "--stats", "--tables", str(_with_cache_hits(table_file, 5).parent))
    assert done.returncode == 0
    assert f"note: {table_file}: 5 of 48 compile times are under 0.05 s" in done.stderr


def _recorded_under_the_interpreter(table_file: Path) -> Path:
    """The table as `fasta-sm record --device cpu` under TRITON_INTERPRET=1 names its timing method."""

    def host_clock(table: dict) -> None:
        table["timing"] = {"method": "host-clock median under the Triton interpreter, 2 passes in opposite orders"}

    return _edited(table_file, host_clock)


def test_tables_stats_notes_nothing_on_a_table_recorded_under_the_interpreter_which_compiles_nothing(table_file):
    _recorded_under_the_interpreter(_with_cache_hits(table_file, 48))
    assert "note:" not in fasta_sm("tables", "--stats", "--tables", str(table_file.parent)).stderr


def test_tables_stats_notes_nothing_on_a_table_of_real_compiles(table_file):
    assert "note:" not in fasta_sm("tables", "--stats", "--tables", str(table_file.parent)).stderr


def test_bench_notes_a_table_whose_cost_reads_low(table_file):
    done = fasta_sm("bench", "--tables", str(_with_cache_hits(table_file, 5).parent), "--seeds", "1",
                    "--policies", "random")
    assert done.returncode == 0
    assert f"note: {table_file}: 5 of 48 compile times" in done.stderr and "cost on this table reads low" in done.stderr


def _with_disturbed_timings(table_file: Path, configs: int) -> Path:
    """The toy table with the second timing of its first `configs` configs that ran doubled, as a disturbance does."""

    def double_second_pass(table: dict) -> None:
        for row in [row for row in table["configs"] if row["error"] is None][:configs]:
            row["duration_us"][1] = 2 * row["duration_us"][0]

    return _edited(table_file, double_second_pass)


def test_tables_stats_notes_a_table_with_timings_too_far_apart_to_be_noise(table_file):
    done = fasta_sm("tables", "--stats", "--tables", str(_with_disturbed_timings(table_file, 4).parent))
    assert done.returncode == 0
    assert f"note: {table_file}: 4 of 48 configs were timed over 1.5x apart" in done.stderr


def test_tables_stats_notes_no_disturbance_on_a_table_timed_by_the_interpreters_host_clock(table_file):
    _recorded_under_the_interpreter(_with_disturbed_timings(table_file, 4))
    assert "note:" not in fasta_sm("tables", "--stats", "--tables", str(table_file.parent)).stderr


def test_tune_notes_a_replayed_table_with_disturbed_timings(table_file, state_dir):
    done = fasta_sm("tune", "--replay", str(_with_disturbed_timings(table_file, 4)), "--state-dir", str(state_dir))
    assert done.returncode == 0 and f"note: {table_file}: 4 of 48 configs were timed over 1.5x apart" in done.stderr


def test_bench_notes_a_table_with_disturbed_timings(table_file):
    done = fasta_sm("bench", "--tables", str(_with_disturbed_timings(table_file, 4).parent), "--seeds", "1",
                    "--policies", "random")
    assert done.returncode == 0 and "record the table again" in done.stderr


def test_tables_of_a_directory_are_listed_by_name(table_file):
    assert fasta_sm("tables", "--tables", str(table_file.parent)).stdout.split() == ["toy_mm"]


def test_tables_into_a_pipe_carry_no_trailing_spaces(table_file, state_dir):
    tune(table_file, state_dir)
    for command in (["ls"], ["report"]):
        done = fasta_sm(*command, "--state-dir", str(state_dir))
        assert done.returncode == 0 and done.stdout.strip()
        assert all(line == line.rstrip() for line in done.stdout.splitlines())


def test_a_warning_into_a_pipe_is_one_line_that_names_the_file_whole(table_file, state_dir):
    tune(table_file, state_dir)
    state_file = next(state_dir.glob("*.fsm"))
    state_file.write_bytes(state_file.read_bytes()[:40])
    done = fasta_sm("tune", "--replay", str(table_file), "--policy", "random", "--budget", "0.5",
                    "--state-dir", str(state_dir))
    quarantined = [line for line in done.stderr.splitlines() if "quarantined" in line]
    assert len(quarantined) == 1 and f"{state_file} as {state_file}.corrupt-" in quarantined[0]


def test_bench_without_scikit_learn_leaves_the_default_trees_baseline_out_and_says_so(table_file):
    code = "import sys; sys.modules['sklearn'] = None; from fasta_sm.cli import run; run()"
    done = subprocess.run([sys.executable, "-c", code, "bench", "--tables", str(table_file.parent), "--seeds", "1"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "trees left out: it needs scikit-learn" in done.stderr and " trees " not in done.stdout


def test_bench_without_scikit_learn_refuses_trees_named_on_the_command_line(table_file):
    code = "import sys; sys.modules['sklearn'] = None; from fasta_sm.cli import run; run()"
    done = subprocess.run([sys.executable, "-c", code, "bench", "--tables", str(table_file.parent), "--seeds", "1",
                           "--policies", "fasta,trees"], capture_output=True, text=True)
    assert done.returncode == 1 and "needs scikit-learn" in done.stderr


def test_fasta_sm_autotune_without_triton_says_what_to_install():
    code = "import sys; sys.modules['triton'] = None; import fasta_sm; fasta_sm.autotune"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "MissingDependency: fasta_sm.autotune needs Triton" in done.stderr
    assert "pip install 'fasta-sm[triton]'" in done.stderr


def test_the_plot_draws_no_legend_entry_per_re_time_round_and_durations_on_log_axes():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from fasta_sm.plot import tune_figure

    state = StateStore.read(CORPUS / "v1-done-retime-contenders.fsm")
    assert sum(record.retime for record in state.rounds) > 1
    figure = tune_figure(state)
    left, right = figure.axes[:2]
    labels = [text.get_text() for text in left.get_legend().get_texts()]
    assert labels and not any("re-time" in label for label in labels)
    assert left.get_yscale() == right.get_yscale() == "log"
    plt.close(figure)


def test_the_plot_stars_a_winner_whose_round_stored_no_predictions_against_the_final_model():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from fasta_sm.plot import tune_figure

    state = StateStore.read(CORPUS / "v1-done-retime-contenders.fsm")
    assert not next(record for record in state.rounds if state.best in record.batch).predicted_us  # a polish pick
    figure = tune_figure(state)
    left = figure.axes[0]
    (star,) = [points for points in left.collections if points.get_label().startswith("winner")]
    assert star.get_offsets().tolist() == [[state.predicted_us[state.best], state.best_us]]
    assert star.get_label() in [text.get_text() for text in left.get_legend().get_texts()]
    plt.close(figure)


def test_the_plots_log_axes_within_a_decade_carry_a_few_plain_labels(state_dir):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from fasta_sm.plot import tune_figure

    invoke("tune", "--replay", "softmax_fp32", "--state-dir", str(state_dir))  # durations 140–200 µs
    figure = tune_figure(StateStore.read(next(state_dir.glob("*.fsm"))))
    figure.canvas.draw()
    left = figure.axes[0]
    for labels in (left.get_xticklabels(which="both"), left.get_yticklabels(which="both")):
        texts = [label.get_text() for label in labels if label.get_text()]
        assert 2 <= len(texts) <= 8 and not any("times" in text or "^" in text for text in texts), texts
    plt.close(figure)


def test_show_finds_a_tune_by_its_file_name_without_the_suffix(table_file, state_dir):
    tune(table_file, state_dir)
    stem = next(state_dir.glob("*.fsm")).stem
    assert "toy_mm" in invoke("show", stem, "--state-dir", str(state_dir))


def test_show_finds_the_one_tune_of_a_kernel_by_the_name_ls_lists(table_file, state_dir):
    tune(table_file, state_dir)
    assert "DONE" in invoke("show", "toy_mm", "--state-dir", str(state_dir))


def test_show_by_a_kernel_name_with_several_tunes_names_their_files(table_file, state_dir):
    tune(table_file, state_dir)
    tune(table_file, state_dir, "--seed", "1")
    result = CliRunner().invoke(main, ["show", "toy_mm", "--state-dir", str(state_dir)])
    assert result.exit_code == 1 and "kernel 'toy_mm' has 2 tunes here" in result.output
    assert all(path.name in result.output for path in state_dir.glob("*.fsm"))


def triton_tunes(table_file: Path, state_dir: Path, kernel: str, *ns: int) -> list[str]:
    """One replayed tune copied under Triton-style keys of `kernel`, one per `n`; their keys."""
    tune(table_file, state_dir)
    (path,) = state_dir.glob("*.fsm")
    store, state = StateStore(state_dir), StateStore.read(path)
    path.unlink()
    keys = [f"{kernel}[{n}, 'torch.float32', 'NVIDIA H200', '3.6.0']" for n in ns]
    for key in keys:
        store.write(key, pack_state(replace(state, kernel=kernel, key=key)), kernel)
    return keys


def test_ls_tells_apart_two_keys_of_one_kernel_by_their_key_values(table_file, state_dir):
    triton_tunes(table_file, state_dir, "mod.add_kernel", 1024, 2048)
    listed = invoke("ls", "--state-dir", str(state_dir))
    assert "mod.add_kernel [1024, 'torch.float32'" in listed and "mod.add_kernel [2048, 'torch.float32'" in listed


def test_report_labels_two_keys_of_one_kernel_by_their_key_values_as_ls_does(table_file, state_dir):
    from fasta_sm.report import report_rows

    triton_tunes(table_file, state_dir, "mod.add_kernel", 1024, 2048)
    rows, _ = report_rows(StateStore(state_dir))
    assert sorted(row["kernel"] for row in rows[:-1]) == [
        "mod.add_kernel [1024, 'torch.float32', 'NVIDIA H200', '3.6.0']",
        "mod.add_kernel [2048, 'torch.float32', 'NVIDIA H200', '3.6.0']",
    ]


def test_report_says_a_tune_ended_with_no_config_run_as_ls_does(tmp_path, state_dir):
    from fasta_sm.report import report_rows

    tune_where_nothing_compiles(tmp_path, state_dir)
    rows, _ = report_rows(StateStore(state_dir))
    assert rows[0]["position"].endswith(", no config ran")


def test_ls_shows_no_key_values_for_a_kernel_with_one_key(table_file, state_dir):
    triton_tunes(table_file, state_dir, "mod.add_kernel", 1024)
    assert "[1024" not in invoke("ls", "--state-dir", str(state_dir))


def test_show_by_a_kernel_name_with_several_keys_lists_each_file_with_its_key_values(table_file, state_dir):
    triton_tunes(table_file, state_dir, "mod.add_kernel", 1024, 2048)
    result = CliRunner().invoke(main, ["show", "mod.add_kernel", "--state-dir", str(state_dir)])
    assert result.exit_code == 1 and "has 2 tunes here" in result.output
    for path in state_dir.glob("*.fsm"):
        key_values = StateStore.read(path).key.removeprefix("mod.add_kernel")
        assert f"{path.name}  mod.add_kernel {key_values}" in result.output


def test_show_finds_a_tune_by_the_kernel_name_without_its_module(table_file, state_dir):
    triton_tunes(table_file, state_dir, "mod.add_kernel", 1024)
    assert "mod.add_kernel" in invoke("show", "add_kernel", "--state-dir", str(state_dir))


def test_ls_on_a_state_dir_without_tunes_says_so_instead_of_an_empty_table(state_dir):
    state_dir.mkdir(parents=True, exist_ok=True)
    done = fasta_sm("ls", "--state-dir", str(state_dir))
    assert done.returncode == 0 and done.stdout == "" and f"no state files in {state_dir}" in done.stderr


def test_report_with_no_readable_tune_says_so_and_names_what_it_skipped(state_dir):
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "broken.fsm").write_bytes(b"not a state")
    done = fasta_sm("report", "--state-dir", str(state_dir))
    assert done.returncode == 0 and done.stdout == ""
    assert "no readable state files" in done.stderr and "broken.fsm" in done.stderr


def test_bench_on_a_tables_dir_that_does_not_exist_prints_the_error_alone(tmp_path):
    done = fasta_sm("bench", "--tables", str(tmp_path / "absent"), "--seeds", "1")
    assert done.returncode == 1 and done.stdout == "" and done.stderr.startswith("Error: ")


def test_record_refuses_a_misspelt_compile_setting_before_it_starts(tmp_path):
    done = fasta_sm("record", "softmax", "--out", str(tmp_path), env={"FASTA_WORKER_TORCH": "ture"})
    assert done.returncode == 1 and done.stderr.startswith("Error: $FASTA_WORKER_TORCH='ture' is neither a yes")


def test_the_log_handler_for_pipes_writes_to_stderr_as_it_is_when_a_record_comes(monkeypatch):
    import io
    import logging

    from fasta_sm.cli import _StderrHandler

    handler = _StderrHandler()
    later = io.StringIO()
    monkeypatch.setattr(sys, "stderr", later)
    handler.emit(logging.makeLogRecord({"msg": "quarantined x.fsm", "levelno": logging.WARNING}))
    assert "quarantined x.fsm" in later.getvalue()


def test_a_state_dir_given_before_the_command_serves_every_command(table_file, state_dir):
    invoke("--state-dir", str(state_dir), "tune", "--replay", str(table_file), "--policy", "random", "--budget", "0.5")
    assert "toy_mm" in invoke("--state-dir", str(state_dir), "ls")
    assert "DONE" in invoke("--state-dir", str(state_dir), "show", "toy_mm")


def test_a_commands_own_state_dir_wins_over_the_one_given_before_it(table_file, state_dir, tmp_path):
    tune(table_file, state_dir)
    assert "toy_mm" in invoke("--state-dir", str(tmp_path / "elsewhere"), "ls", "--state-dir", str(state_dir))


def test_an_empty_replay_name_is_an_error_not_the_default_table(state_dir):
    done = fasta_sm("tune", "--replay", "", "--state-dir", str(state_dir))
    assert done.returncode == 1 and "no replay table ''" in done.stderr
    assert not list(state_dir.glob("*.fsm"))


def test_show_of_a_states_json_rendering_says_it_is_one_and_that_show_reads_the_state_file():
    done = fasta_sm("show", str(CORPUS / "v1-done-exhaustive.json"))
    assert done.returncode == 1 and "it is JSON: a state's rendering" in done.stderr


def test_show_of_a_damaged_state_file_gives_no_rendering_hint(tmp_path):
    (tmp_path / "damaged.fsm").write_bytes(b"garbage")
    done = fasta_sm("show", str(tmp_path / "damaged.fsm"))
    assert done.returncode == 1 and "not a msgpack state file" in done.stderr and "rendering" not in done.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
def test_show_of_a_fifo_in_the_state_dir_says_it_is_not_a_regular_file_rather_than_absent(table_file, state_dir):
    tune(table_file, state_dir)
    os.mkfifo(state_dir / "fifo.fsm")
    done = fasta_sm("show", "fifo.fsm", "--state-dir", str(state_dir))
    assert done.returncode == 1 and "fifo.fsm: unreadable (not a regular file)" in done.stderr


def test_a_shipped_tables_file_name_finds_it_as_its_name_does(state_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no softmax_fp32.json here
    assert "softmax_fp32" in invoke("tune", "--replay", "softmax_fp32.json", "--state-dir", str(state_dir))


def test_a_folder_here_named_like_a_shipped_table_does_not_hide_it(state_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "softmax_fp32").mkdir()  # an output folder named after the kernel, say
    assert "softmax_fp32  (replayed from" in invoke("tune", "--replay", "softmax_fp32", "--state-dir", str(state_dir))


def test_a_replay_path_that_is_a_folder_is_named_as_one(state_dir, tmp_path):
    done = fasta_sm("tune", "--replay", str(tmp_path), "--state-dir", str(state_dir))
    assert done.returncode == 1 and f"{tmp_path}: not a JSON replay table (IsADirectoryError" in done.stderr


def test_a_replay_path_that_does_not_exist_lists_the_shipped_tables(state_dir, tmp_path):
    done = fasta_sm("tune", "--replay", str(tmp_path / "nope.json"), "--state-dir", str(state_dir))
    assert done.returncode == 1 and "not a file, nor one of add_gelu_bf16" in done.stderr


def test_show_by_a_kernel_name_notes_an_unreadable_file_that_may_hold_another_tune_of_it(table_file, state_dir):
    tune(table_file, state_dir)
    (state_dir / "damaged.fsm").write_bytes(b"garbage")
    done = fasta_sm("show", "toy_mm", "--state-dir", str(state_dir))
    assert done.returncode == 0 and "damaged.fsm" in done.stderr and "another tune of 'toy_mm'" in done.stderr


@pytest.mark.parametrize("command", [("tune",), ("bench", "--seeds", "1", "--policies", "random")])
def test_a_command_into_a_pipe_prints_its_table_with_no_line_before_it(command, table_file, state_dir):
    where = ["--replay", str(table_file)] if command[0] == "tune" else ["--tables", str(table_file.parent)]
    if command[0] == "tune":
        where += ["--state-dir", str(state_dir)]
    done = fasta_sm(*command, *where)
    assert done.returncode == 0 and done.stdout.splitlines()[0].strip(), done.stdout[:80]


def test_tables_lists_the_readable_tables_and_fails_naming_one_it_cannot_read(table_file):
    (table_file.parent / "truncated.json").write_text('{"kernel": "x", "configs": [')
    done = fasta_sm("tables", "--tables", str(table_file.parent))
    assert done.returncode == 1 and done.stdout.split() == ["toy_mm"] and "truncated.json" in done.stderr


def test_tune_says_its_figures_are_a_replay_of_a_recorded_table(table_file, state_dir):
    kernel_line = next(line for line in tune(table_file, state_dir).splitlines() if line.startswith("kernel"))
    assert "replayed from a table recorded on" in kernel_line


def test_show_explains_a_must_measure_tune_whose_inner_params_are_not_a_map(tmp_path):
    import msgpack

    data = msgpack.unpackb((CORPUS / "v1-live-h200-inductor-gelu.fsm").read_bytes(), raw=False, strict_map_key=False)
    assert data["schema"] == 1 and data["policy"] == "must-measure"  # no checksum to seal again
    data["policy_params"]["params"] = 5
    data["policy_state"]["params"]["retime_z"] = 1.0  # a stored knob unlike today's default, so show compares
    path = tmp_path / "edited.fsm"
    path.write_bytes(msgpack.packb(data, use_bin_type=True))
    done = fasta_sm("show", str(path))
    assert done.returncode == 0 and "retime_z" in done.stdout, done.stderr[-300:]


def superseding_tune(table_file: Path, state_dir: Path) -> Path:
    """A tune of the table's whole list after one of all but its first six configs: it takes that one's results,
    three of them failures."""
    table = load_table(table_file)
    store = StateStore(state_dir)
    api_tune("k", "toy_mm", table.configs[6:], ReplayBackend(table), policy="exhaustive", store=store)
    api_tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="exhaustive", store=store)
    return store.file_for("k")


def test_show_says_which_results_a_tune_took_from_the_one_it_superseded(table_file, state_dir):
    out = invoke("show", str(superseding_tune(table_file, state_dir)), "--state-dir", str(state_dir))
    line = " ".join(out[out.index("carried"):].split("\n\n")[0].split())
    assert "from a superseded tune, at no cost here: the compiles of #6, #7" in line
    assert "with 39 of their timings; the compile outcomes alone of #45, #46, #47" in line


def test_show_says_a_compile_taken_mid_round_waits_for_its_carried_timings(table_file, state_dir):
    def stop_before_timing(state):
        if state.step == "benchmark":  # the carried compiles are taken, their carried timings not yet
            raise KeyboardInterrupt

    table = load_table(table_file)
    store = StateStore(state_dir)
    api_tune("k", "toy_mm", table.configs[6:], ReplayBackend(table), policy="exhaustive", store=store)
    with pytest.raises(KeyboardInterrupt):
        api_tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="exhaustive", store=store,
                 on_step=stop_before_timing)
    out = " ".join(invoke("show", str(store.file_for("k")), "--state-dir", str(state_dir)).split())
    assert "the compiles of #6, #7" in out and "whose carried timings are taken when they are timed" in out
    assert "the compile outcomes alone of #45, #46, #47" in out


def test_show_json_lists_the_results_a_tune_took_and_how_many_timings_came_with_each(table_file, state_dir):
    state = StateStore.read(path := superseding_tune(table_file, state_dir))
    shown = json.loads(invoke("show", str(path), "--json", "--state-dir", str(state_dir)))
    assert shown["carried_taken"] == [{"index": i, "timings": n} for i, n in sorted(state.carried_taken.items())]


@pytest.mark.parametrize("args", [
    ("tune", "--seed"),
    ("bench", "--seeds"),
    ("record", "softmax", "--out"),
    ("--state-dir",),
], ids=["tune", "bench", "record", "before the command"])
def test_an_option_missing_its_value_prints_the_usage_before_the_error(args):
    done = fasta_sm(*args)
    assert done.returncode == 2 and "requires an argument" in done.stderr
    assert done.stderr.startswith("Usage: "), done.stderr  # the program name is `-c` here, `fasta-sm` installed


@pytest.mark.parametrize("error", ["ImportError", "ValueError"])  # numpy raises the second: "dtype size changed"
def test_a_scikit_learn_that_does_not_import_is_an_error_not_a_traceback(error, table_file, tmp_path):
    broken = tmp_path / "site" / "sklearn"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(f"raise {error}('built against another numpy')\n")
    done = fasta_sm("tune", "--replay", str(table_file), "--policy", "trees", "--state-dir", str(tmp_path / "states"),
                    env={"PYTHONPATH": str(tmp_path / "site")})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "scikit-learn" in done.stderr and "built against another numpy" in done.stderr


def test_a_reader_that_closes_the_pipe_early_ends_show_quietly_with_status_1():
    reader = subprocess.Popen([sys.executable, "-c", "from fasta_sm.cli import run; run()", "show",
                               str(CORPUS / "v2-done-retime-cut.fsm")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": ""})
    reader.stdout.readline()
    reader.stdout.close()  # as `| head -1` does
    assert reader.wait(timeout=60) == 1  # as Python's documentation advises for a broken pipe (and rich does)
    assert reader.stderr.read() == b""


def test_show_names_every_config_of_a_batch_of_thirteen():
    out = invoke("show", str(CORPUS / "v1-r1-compile.fsm"))
    assert "#162, #191" in " ".join(out.split()) and "…" not in out.split("pending")[1].split("\n\n")[0]


def test_show_says_when_the_winner_was_never_re_timed_while_others_were():
    out = " ".join(invoke("show", str(CORPUS / "v1-live-h200-inductor-layernorm.fsm")).split())
    assert "27.49 µs (1 timing; never re-timed: the configs re-timed came out slower)" in out


def test_show_says_nothing_of_re_timing_on_the_best_line_of_a_winner_that_was_re_timed():
    out = invoke("show", str(CORPUS / "v2-done-retime-cut.fsm"))
    assert "never re-timed" not in out


def superseding_tune_whose_carried_contenders_fail_when_re_timed(table_file: Path, state_dir: Path) -> Path:
    """A fasta tune that takes the configs its superseded tune re-timed, with their timings, and re-times them here,
    where they fail."""
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = api_tune("k", "toy_mm", table.configs[:-6], ReplayBackend(table), policy="fasta", store=store).state
    doomed = {table.index_of(first.configs[i]) for i, timings in first.durations.items() if len(timings) > 1}

    class FailingWhenReTimed(ReplayBackend):
        def benchmark(self, configs, repeat=None):
            outcome = super().benchmark(configs, repeat)
            durations, errors = list(outcome.durations_us), dict(outcome.errors)
            for position, config in enumerate(configs):
                if table.index_of(config) in doomed and repeat and repeat[position]:
                    durations[position], errors[position] = math.inf, "died when re-timed"
            return BenchmarkOutcome(durations, outcome.seconds, errors)

    second = api_tune("k", "toy_mm", table.configs, FailingWhenReTimed(table), policy="fasta", store=store).state
    retimed = {i for r in second.rounds if r.retime for i in r.batch}
    assert retimed and retimed <= set(second.failed) and retimed <= {i for i, n in second.carried_taken.items() if n}
    return store.file_for("k")


def test_show_neither_calls_carried_timings_dropped_by_a_failure_a_compile_alone_nor_a_failure_slower(
    table_file, state_dir
):
    path = superseding_tune_whose_carried_contenders_fail_when_re_timed(table_file, state_dir)
    state = StateStore.read(path)
    out = " ".join(invoke("show", str(path), "--state-dir", str(state_dir)).split())
    dropped = ", ".join(f"#{i}" for i in sorted(i for i, n in state.carried_taken.items() if n and i in state.failed))
    assert f"the compiles of {dropped} with" in out and "dropped when a later timing failed" in out
    assert "compile outcomes alone of " + dropped not in out
    assert "never re-timed: the configs re-timed failed)" in out and "came out slower" not in out


def test_report_csv_onto_a_state_file_it_reads_is_refused_and_the_tune_kept(table_file, state_dir):
    tune(table_file, state_dir)
    state_file = next(state_dir.glob("*.fsm"))
    before = state_file.read_bytes()
    result = CliRunner().invoke(main, ["report", "--state-dir", str(state_dir), "--csv", str(state_file)])
    assert result.exit_code == 2, result.output
    assert str(state_file) in result.output and "state file" in result.output
    assert state_file.read_bytes() == before


def test_report_csv_in_the_state_dir_under_a_name_no_state_file_takes_is_written(table_file, state_dir):
    tune(table_file, state_dir)
    out_csv = state_dir / "summary.fsm.csv"
    invoke("report", "--state-dir", str(state_dir), "--csv", str(out_csv))
    assert out_csv.read_text().startswith("file,")


@pytest.mark.parametrize("args", [["graph", "--out", "-"], ["report", "--csv", "-"], ["bench", "--json", "-"]])
def test_an_output_named_dash_is_refused_not_written_as_a_file_named_dash(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, [*args, *(["--state-dir", str(tmp_path)] if args[0] == "report" else [])])
    assert result.exit_code == 2, result.output
    assert "'-'" in result.output
    assert not (tmp_path / "-").exists()


def _table_row(out: str, index: int) -> list[str]:
    """The cells of the first row of a `show` table (Measured, then Failed) that lists config `index`."""
    return _round_row(out, f"{index} ")


def test_show_names_the_round_that_measured_each_config(monkeypatch):
    # #149 came from the polish round R2_9 (states/README.md); the Rounds table gives only batch sizes
    monkeypatch.setenv("COLUMNS", "250")
    out = invoke("show", str(CORPUS / "v1-done-retime-contenders.fsm"))
    assert _table_row(out, 149)[1] == "R2_9"


def test_show_names_the_round_that_tried_each_failed_config(monkeypatch):
    # R2_5 tried #139 alone, and it did not fit: without its round the row R2_5 explains nothing
    monkeypatch.setenv("COLUMNS", "250")
    out = invoke("show", str(CORPUS / "v1-done-with-failures.fsm"))
    failed = out[out.index("Failed"):]
    assert _table_row(failed, 139)[:2] == ["139", "R2_5"]


def test_show_gives_the_range_of_a_re_timed_configs_timings(monkeypatch):
    # #2's mean 30.77 µs hides a 24.03 µs timing and a 37.50 µs one: that noise is why #18 (27.49 µs once) won
    monkeypatch.setenv("COLUMNS", "250")
    out = invoke("show", str(CORPUS / "v1-live-h200-inductor-layernorm.fsm"))
    assert "24.03 µs – 37.50 µs" in _table_row(out, 2)


def test_show_takes_a_state_file_path_typed_without_its_suffix(tmp_path):
    corpus_file = CORPUS / "v1-done-with-failures.fsm"
    shown = invoke("show", str(corpus_file.with_suffix("")), "--state-dir", str(tmp_path))
    assert "corpus/v1-done-with-failures" in shown and "v1-done-with-failures.fsm" in shown
