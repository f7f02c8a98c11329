"""Specs for StateStore: where files go, how they are written, what happens to bad ones."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import filelock
import msgpack
import pytest
from engine_harness import CountingBackend, seal

from fasta_sm import store as store_module
from fasta_sm.errors import LockTimeout, PolicyError, SettingError, StateDirError, TuneFailed
from fasta_sm.state import pack_state
from fasta_sm.store import StateStore, default_lock_timeout, default_state_dir
from fasta_sm.tuner import open_tune, tune

KEY = "mm_synth:fp16:1024"
HASHED_NAME = re.compile(r"^[0-9a-f]{32}\.(fsm|lock)$")


def run_tune(table, backend, store, key=KEY, **kw):
    return tune(key, table.kernel, table.configs, backend, policy=kw.pop("policy", "exhaustive"), store=store, **kw)


def save(store: StateStore, state) -> Path:
    """Write `state` as its key's file, as a checkpoint does."""
    return store.write(state.key, pack_state(state), kernel=state.kernel)


# --------------------------------------------------------------------------- names and places


@pytest.mark.parametrize(
    "key", ["../../escape", "/etc/passwd", "a/b/c", "..", ".", "", "k\x00ey", "ключ:fp16", "x" * 5000]
)
def test_state_file_names_are_hashes_never_raw_keys(key, table, backend, tmp_path):
    store = StateStore(tmp_path / "states")
    run_tune(table, backend, store, key=key)
    names = sorted(p.name for p in (tmp_path / "states").iterdir())
    assert names and all(HASHED_NAME.match(n) for n in names), names
    assert store.file_for(key).parent == store.path
    assert store.file_for(key).exists()
    # nothing was written anywhere but the state dir
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mm_synth.json", "states"]


def test_distinct_keys_get_distinct_files(store):
    assert len({store.file_for("a/b"), store.file_for("a_b"), store.file_for("a:b")}) == 3


def test_a_missing_state_dir_is_created_with_mode_0700(tmp_path, table, backend):
    path = tmp_path / "not" / "yet" / "there"
    store = StateStore(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert run_tune(table, backend, store).state.done


def test_the_default_state_dir_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTA_SM_STATE_DIR", str(tmp_path / "from-env"))
    assert StateStore().path == tmp_path / "from-env"
    assert (tmp_path / "from-env").is_dir()


@pytest.mark.parametrize("text", ["", "  "])
def test_a_state_dir_variable_set_to_nothing_is_the_per_user_default(text, monkeypatch):
    monkeypatch.delenv("FASTA_SM_STATE_DIR", raising=False)
    default = default_state_dir()
    monkeypatch.setenv("FASTA_SM_STATE_DIR", text)  # not a folder named by blanks in the working directory
    assert default_state_dir() == default


def test_a_state_dir_that_cannot_be_created_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StateDirError, match=re.escape(str(blocker / "states"))):
        StateStore(blocker / "states")


def test_an_empty_state_dir_name_is_refused_not_taken_as_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StateDirError, match="state dir '' is empty"):
        StateStore("")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("path", [3, b"/tmp/states"], ids=["a number", "bytes"])
def test_a_state_dir_that_is_no_path_is_refused_naming_it(path):
    with pytest.raises(StateDirError, match=re.escape(f"state dir {path!r} must be a path")):
        StateStore(path)


@pytest.mark.parametrize("path", ["", 5])
def test_driver_settings_with_a_state_dir_that_names_no_directory_are_refused(path):
    from fasta_sm.driver import DriverSettings

    with pytest.raises(StateDirError, match=re.escape(f"state dir {path!r}")):
        DriverSettings(state_dir=path).checked()


def test_driver_settings_whose_state_dir_is_a_file_are_refused_naming_it(tmp_path):
    from fasta_sm.driver import DriverSettings

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(StateDirError, match=re.escape(str(blocker)) + ".*not a directory"):
        DriverSettings(state_dir=str(blocker)).checked()


def test_a_state_dir_deleted_while_its_store_lives_is_made_again_private(tmp_path, table, backend):
    path = tmp_path / "states"
    store = StateStore(path)
    shutil.rmtree(path)
    assert run_tune(table, backend, store).state.done
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_a_state_dir_path_that_is_a_file_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(StateDirError, match=re.escape(str(blocker)) + ".*not a directory"):
        StateStore(blocker)


@contextlib.contextmanager
def read_only_dir(path: Path):
    """Make `path` a directory no one can create files in, even root.

    Tests run as root here, and root ignores permission bits (CAP_DAC_OVERRIDE),
    so `chmod 0500` would prove nothing. The honest equivalents:
    - not root: `chmod 0500` is enough;
    - root: `chattr +i` sets the immutable attribute, which the kernel enforces
      for root as well (creating, renaming or deleting entries fails with EPERM).
      It needs CAP_LINUX_IMMUTABLE and a file system that supports it (ext4,
      xfs, btrfs, tmpfs from 6.0); where it is refused the test is skipped
      with the reason rather than faked.
    """
    path.mkdir(mode=0o700, exist_ok=True)
    if os.geteuid() != 0:
        path.chmod(0o500)
        try:
            yield path
        finally:
            path.chmod(0o700)
        return
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("running as root and no chattr: cannot make a directory read-only for root")
    done = subprocess.run([chattr, "+i", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"running as root and chattr +i refused ({done.stderr.strip()}): cannot make a read-only dir")
    try:
        probe = path / "probe"
        with contextlib.suppress(OSError):
            probe.touch()
            probe.unlink()
            pytest.skip("chattr +i did not stop root from writing here")
        yield path
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


def test_a_read_only_state_dir_is_a_clear_error_naming_the_dir(tmp_path, table, backend):
    with read_only_dir(tmp_path / "ro") as path:
        store = StateStore(path)
        with pytest.raises(StateDirError) as caught:
            run_tune(table, backend, store)
        assert str(path) in str(caught.value)
        assert "not writable" in str(caught.value) or "cannot write" in str(caught.value)


def test_writing_into_a_read_only_state_dir_is_a_clear_error_naming_the_dir(tmp_path):
    from test_engine_state import sample_state

    with read_only_dir(tmp_path / "ro") as path:
        store = StateStore(path)
        with pytest.raises(StateDirError, match=re.escape(str(path))):
            save(store, sample_state())


# --------------------------------------------------------------------------- atomic writes


def test_a_write_leaves_exactly_the_state_file_and_no_temp_files(store):
    from test_engine_state import sample_state

    state = sample_state()
    for seed in range(20):
        state.seed = seed
        save(store, state)
    assert [p.name for p in store.path.iterdir()] == [store.file_for(state.key).name]
    assert store.read(store.file_for(state.key)).seed == 19


def test_a_write_that_fails_midway_keeps_the_old_file_and_leaves_no_temp_file(store, monkeypatch):
    from test_engine_state import sample_state

    old = sample_state()
    save(store, old)

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space left"):
        save(store, sample_state(round=99))
    monkeypatch.undo()
    assert [p.name for p in store.path.iterdir()] == [store.file_for(old.key).name]
    assert store.read(store.file_for(old.key)).round == old.round


def test_a_checkpoint_is_on_disk_under_its_temp_name_before_it_replaces_the_file_then_the_dir_is_synced(
        store, monkeypatch):
    """The order that makes a write survive a power cut: fsync the temp file, rename, fsync the directory."""
    from test_engine_state import sample_state

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        info = os.fstat(fd)
        events.append(("fsync", "dir" if stat.S_ISDIR(info.st_mode) else info.st_ino))
        real_fsync(fd)

    def replace(source, target):
        events.append(("replace", os.stat(source).st_ino, os.fspath(source)))
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save(store, sample_state())
    (_, synced), (_, renamed, temp_name), last = events
    assert synced == renamed and temp_name.endswith(".tmp") and last == ("fsync", "dir")


def test_a_tune_leaves_only_its_state_file_and_lock(table, backend, store):
    run_tune(table, backend, store, chunk_size=4)
    names = sorted(p.name for p in store.path.iterdir())
    assert names == sorted([store.file_for(KEY).name, store.lock_path_for(KEY).name])


def test_temp_files_left_by_a_killed_writer_are_discarded_by_the_next_tune(table, backend, store):
    leftover = store.path / (store.file_for(KEY).name + ".abc123.tmp")
    leftover.write_bytes(b"half a state")
    run_tune(table, backend, store)
    assert not leftover.exists()


def test_a_leftover_temp_file_the_state_dir_will_not_let_go_of_is_a_state_dir_error_naming_both(
        table, backend, store, monkeypatch):
    leftover = store.path / (store.file_for(KEY).name + ".abc123.tmp")
    leftover.write_bytes(b"half a state")
    unlink = Path.unlink

    def read_only_unlink(path, *args, **kwargs):  # a read-only mount: EROFS, not "no such file"
        if path.suffix == ".tmp":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", read_only_unlink)
    with pytest.raises(StateDirError, match=rf"cannot remove {leftover.name}, left in state dir {store.path}"):
        run_tune(table, backend, store)


# --------------------------------------------------------------------------- reuse


def test_a_done_state_is_reused_with_no_compile_and_no_benchmark(table, backend, state_dir):
    first = run_tune(table, backend, StateStore(state_dir))
    counting = CountingBackend(backend)
    again = run_tune(table, counting, StateStore(state_dir))
    assert again.reused and not first.reused
    assert (counting.compile_calls, counting.benchmark_calls) == (0, 0)
    assert again.best_config == first.best_config and again.best_us == first.best_us


def test_a_done_state_is_reused_even_while_another_process_holds_the_lock(table, backend, store):
    run_tune(table, backend, store)
    counting = CountingBackend(backend)
    with holding_lock(store.lock_path_for(KEY)):
        again = run_tune(table, counting, store, lock_timeout_s=0)  # a wait for the lock would time out at once
    assert again.reused and counting.compile_calls == counting.benchmark_calls == 0


def test_a_changed_config_list_starts_a_new_tune_and_keeps_the_old_state_readable(table, backend, store):
    run_tune(table, backend, store)
    result = tune(KEY, table.kernel, table.configs[:-1], backend, policy="exhaustive", store=store)
    assert not result.reused and result.state.n_configs == len(table.configs) - 1
    superseded = list(store.path.glob("*.superseded-*"))
    assert len(superseded) == 1 and store.read(superseded[0]).n_configs == len(table.configs)


def test_a_fasta_knob_set_in_the_environment_after_a_tune_starts_a_new_tune(table, backend, store, monkeypatch):
    monkeypatch.delenv("FASTA_R1_PCT", raising=False)
    run_tune(table, backend, store, policy="fasta")
    monkeypatch.setenv("FASTA_R1_PCT", "0.1")
    again = run_tune(table, backend, store, policy="fasta")
    assert not again.reused and again.state.policy_params == {"r1_frac": 0.1}
    assert len(list(store.path.glob("*.superseded-*"))) == 1


def test_a_fasta_variable_set_to_its_default_keeps_the_tune(table, backend, store, monkeypatch):
    monkeypatch.delenv("FASTA_R1_PCT", raising=False)
    run_tune(table, backend, store, policy="fasta")
    monkeypatch.setenv("FASTA_R1_PCT", "0.06")  # the default: the settings did not change
    assert run_tune(table, backend, store, policy="fasta").reused


def test_open_tune_takes_the_parameters_it_is_given_not_the_environment(table, backend, store, monkeypatch):
    monkeypatch.setenv("FASTA_SMALL_BUDGET", "0.9")  # a compile worker's environment may differ from its parent's
    with store.lock(KEY, table.kernel):
        opened = open_tune(store, KEY, table.kernel, table.configs, backend, policy="fasta", policy_params={})
        state = opened.drive()
    monkeypatch.delenv("FASTA_SMALL_BUDGET")
    assert state.policy_params == {}
    default = run_tune(table, backend, StateStore(store.path / "other"), policy="fasta", policy_params={}).state
    assert state.durations == default.durations  # measured as the tune's own (default) budget says


def test_a_tune_under_the_same_environment_is_reused(table, backend, store, monkeypatch):
    monkeypatch.setenv("FASTA_R1_PCT", "0.1")
    run_tune(table, backend, store, policy="fasta")
    assert run_tune(table, backend, store, policy="fasta").reused


def test_a_knob_given_explicitly_wins_over_the_environment(table, backend, store, monkeypatch):
    monkeypatch.setenv("FASTA_R1_PCT", "0.1")
    result = run_tune(table, backend, store, policy="fasta", policy_params={"r1_frac": 0.2})
    assert result.state.policy_params == {"r1_frac": 0.2}


def test_a_bad_fasta_variable_is_a_policy_error_naming_kernel_and_variable(table, backend, store, monkeypatch):
    monkeypatch.setenv("FASTA_R1_PCT", "lots")
    with pytest.raises(PolicyError, match=rf"kernel '{table.kernel}'.*FASTA_R1_PCT='lots'"):
        run_tune(table, backend, store, policy="fasta")
    assert not list(store.path.glob("*.fsm"))


def test_results_carried_into_a_tune_survive_a_second_change_of_the_list(table, backend, store):
    def first_step_only(state):
        raise KeyboardInterrupt

    tune(KEY, table.kernel, table.configs, backend, policy="exhaustive", store=store)
    with pytest.raises(KeyboardInterrupt):  # the list changes, and the new tune stops before using what it carried
        tune(KEY, table.kernel, table.configs[:-1], CountingBackend(backend), policy="exhaustive", store=store,
             on_step=first_step_only)
    counting = CountingBackend(backend)
    tune(KEY, table.kernel, table.configs[:-2], counting, policy="exhaustive", store=store)
    assert counting.compiled == [] and counting.benchmarked == []


def test_results_carried_into_a_tune_and_compiled_there_survive_a_second_change_of_the_list(table, backend, store):
    def stop_before_timing(state):
        if state.step == "benchmark":  # the carried compiles are taken, the carried timings not yet
            raise KeyboardInterrupt

    tune(KEY, table.kernel, table.configs, backend, policy="exhaustive", store=store)
    with pytest.raises(KeyboardInterrupt):
        tune(KEY, table.kernel, table.configs[:-1], CountingBackend(backend), policy="exhaustive", store=store,
             on_step=stop_before_timing)
    counting = CountingBackend(backend)
    tune(KEY, table.kernel, table.configs[:-2], counting, policy="exhaustive", store=store)
    assert counting.compiled == [] and counting.benchmarked == []


def test_a_progress_callback_that_raises_loses_no_checkpoint_and_times_nothing_twice(table, backend, store):
    calls = []

    def flaky(state):
        calls.append(state.position())
        if len(calls) == 3:
            raise RuntimeError("display closed")

    counting = CountingBackend(backend)
    result = tune(KEY, table.kernel, table.configs, counting, policy="exhaustive", store=store, on_step=flaky,
                  chunk_size=8, benchmark_chunk=8)
    assert result.state.done
    assert len(counting.benchmarked) == len({c.identity for c in counting.benchmarked})


def fasta_state_after_r1_compiles(table, backend, store):
    """A fasta tune stopped once R1 is compiled, its state as the file holds it."""

    def stop_after_r1_compiles(state):
        if state.step == "benchmark":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune(KEY, table.kernel, table.configs, backend, policy="fasta", store=store, on_step=stop_after_r1_compiles)
    return store.read(store.file_for(KEY))


def test_a_policy_state_of_the_wrong_shape_is_set_aside_whatever_the_policy_raises(table, backend, store):
    state = fasta_state_after_r1_compiles(table, backend, store)
    state.policy_state = {**state.policy_state, "timings": []}  # a list where the policy keeps a map
    save(store, state)
    result = tune(KEY, table.kernel, table.configs, backend, policy="fasta", store=store)
    assert result.state.done and any("cannot resume" in note for note in result.state.restarts)


def test_a_policy_state_the_policy_refuses_with_an_error_whose_message_cannot_be_had_is_set_aside(
    table, backend, store, monkeypatch
):
    from fasta_sm.policies.fasta import FastaPolicy

    class UnprintableError(Exception):
        def __str__(self):
            raise ValueError("no message")

    fasta_state_after_r1_compiles(table, backend, store)
    loads = FastaPolicy.load_state_dict

    def refuse_once(self, state):
        monkeypatch.setattr(FastaPolicy, "load_state_dict", loads)
        raise UnprintableError

    monkeypatch.setattr(FastaPolicy, "load_state_dict", refuse_once)
    result = tune(KEY, table.kernel, table.configs, backend, policy="fasta", store=store)
    assert result.state.done and any("cannot resume" in n and "UnprintableError" in n for n in result.state.restarts)


@pytest.mark.parametrize(
    ("field", "value"),
    [("last_batch", [0]), ("phase", "done")],
    ids=["a last batch outside the open round", "a policy that had stopped"],
)
def test_a_policy_state_that_did_not_issue_the_open_round_is_set_aside_not_failed_at_every_run(
    table, backend, store, field, value
):
    state = fasta_state_after_r1_compiles(table, backend, store)
    outside = next(i for i in range(state.n_configs) if i not in state.pending)
    state.policy_state = {**state.policy_state, field: [outside] if field == "last_batch" else value}
    save(store, state)
    result = tune(KEY, table.kernel, table.configs, backend, policy="fasta", store=store)
    assert result.state.done and any("did not issue the open round" in note for note in result.state.restarts)


def test_a_fasta_state_past_r1_with_no_policy_state_is_set_aside_not_resumed_by_a_blank_policy(table, backend, store):
    state = fasta_state_after_r1_compiles(table, backend, store)
    state.policy_state = {}
    save(store, state)
    result = tune(KEY, table.kernel, table.configs, backend, policy="fasta", store=store)
    assert result.state.done and any("cannot resume" in note for note in result.state.restarts)


def test_a_state_its_policy_cannot_resume_from_is_set_aside_and_a_fresh_tune_keeps_its_results(
    table, backend, store
):
    state = fasta_state_after_r1_compiles(table, backend, store)
    compiled_before = {state.configs[i].identity for i in list(state.compiled) + list(state.failed)}
    state.policy_state = {"version": 99}
    save(store, state)
    counting = CountingBackend(backend)
    result = tune(KEY, table.kernel, table.configs, counting, policy="fasta", store=store)
    assert result.state.done and any("superseded" in note for note in result.state.restarts)
    assert list(store.path.glob("*.superseded-*")) and not list(store.path.glob("*.corrupt-*"))
    assert compiled_before and not compiled_before & {c.identity for c in counting.compiled}


def test_a_state_file_that_cannot_be_written_is_a_state_dir_error_naming_kernel_and_file(
    table, backend, store, monkeypatch
):
    def full_disk(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(StateDirError, match=r"kernel 'mm_synth': cannot write state file .*\.fsm: No space left"):
        run_tune(table, backend, store)
    assert not list(store.path.glob("*.tmp"))


def test_a_state_file_whose_write_failed_on_a_file_system_gone_read_only_is_a_state_dir_error_naming_kernel_and_file(
    table, backend, store, monkeypatch
):
    def io_error(fd):  # ext4's errors=remount-ro: the failed write turns the file system read-only
        raise OSError(errno.EIO, "Input/output error")

    def read_only(path, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(os, "fsync", io_error)
    monkeypatch.setattr(os, "unlink", read_only)
    with pytest.raises(StateDirError, match=r"kernel 'mm_synth': cannot write state file .*\.fsm: Input/output error"):
        run_tune(table, backend, store)


@pytest.mark.parametrize("timeout", [-1, True, math.nan])
def test_a_tune_lock_timeout_that_is_no_wait_is_refused_naming_it(timeout, table, backend, store):
    with pytest.raises(ValueError, match=re.escape(f"lock_timeout_s={timeout!r}")):
        run_tune(table, backend, store, lock_timeout_s=timeout)


def test_driver_settings_refuse_a_lock_timeout_of_true():
    from fasta_sm.driver import DriverSettings

    with pytest.raises(ValueError, match=r"lock_timeout_s=True"):
        DriverSettings(lock_timeout_s=True).checked()


# --------------------------------------------------------------------------- quarantine


def _valid_blob(table, tmp_path) -> bytes:
    from fasta_sm.backends.replay import ReplayBackend

    scratch = StateStore(tmp_path / "scratch")
    run_tune(table, ReplayBackend(table), scratch)
    return scratch.file_for(KEY).read_bytes()


def _other_schema(blob: bytes) -> bytes:
    data = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    data["schema"] = 99
    return seal(data)


def _timing_bit_flipped(blob: bytes) -> bytes:
    """One bit flipped in a stored timing: the file still decodes, to a wrong duration."""
    data = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    timing = next(iter(data["durations"].values()))[0]
    at = blob.index(b"\xcb" + struct.pack(">d", timing)) + 1
    return blob[:at] + bytes([blob[at] ^ 0x40]) + blob[at + 1:]


BAD_FILES = {
    "truncated": lambda blob: blob[: len(blob) // 2],
    "garbage": lambda blob: os.urandom(64) + b"\xc1garbage\xc1",
    "empty": lambda blob: b"",
    "other-schema": _other_schema,
    "timing-bit-flipped": _timing_bit_flipped,
    # valid msgpack, not a state: a list, and a map of today's schema lacking most fields
    "msgpack-list": lambda blob: msgpack.packb([1, "two", {"three": 3}]),
    "msgpack-map-missing-fields": lambda blob: seal({"key": KEY, "kernel": "mm_synth", "schema": 3}),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_a_bad_state_file_is_quarantined_with_one_warning_and_the_tune_starts_afresh(
    kind, table, backend, store, tmp_path, caplog
):
    import logging

    bad = BAD_FILES[kind](_valid_blob(table, tmp_path))
    path = store.file_for(KEY)
    path.write_bytes(bad)
    caplog.clear()
    caplog.set_level(logging.WARNING)
    counting = CountingBackend(backend)
    result = run_tune(table, counting, store)

    assert result.state.done and not result.reused
    assert counting.compile_calls > 0 and counting.benchmark_calls > 0  # afresh
    moved = list(store.path.glob(path.name + ".corrupt-*"))
    assert len(moved) == 1
    assert re.fullmatch(re.escape(path.name) + r"\.corrupt-\d{8}T\d{6}\.\d{6}", moved[0].name)
    assert moved[0].read_bytes() == bad  # nothing lost: kept aside for inspection
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert str(path) in warnings[0] and str(moved[0]) in warnings[0]
    assert store.read(path).done  # the fresh tune's file is valid


def test_a_bad_state_file_in_a_dir_whose_name_is_not_utf8_is_quarantined_and_the_record_says_so(
        table, backend, tmp_path):
    state_dir = tmp_path / os.fsdecode(b"states-\xff")  # bytes no UTF-8 decoder takes, as a Linux path may hold
    store = StateStore(state_dir)
    store.file_for(KEY).write_bytes(b"\xc1 garbage")
    result = run_tune(table, backend, store)
    assert result.state.done
    (note,) = store.read(store.file_for(KEY)).restarts
    assert note.startswith("previous state quarantined as ")


class _Trap:
    """Unpickling this writes a marker file: proof that something unpickled a state file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "unpickled"))


@pytest.mark.parametrize("protocol", [0, 1, 5])
def test_a_pickle_in_a_state_files_place_is_quarantined_and_never_unpickled(protocol, table, backend, store,
                                                                           tmp_path):
    """Protocols 0 and 1 are text that msgpack does not refuse at its first byte, as it does 2 and later."""
    import pickle

    marker = tmp_path / "marker"
    store.file_for(KEY).write_bytes(pickle.dumps(_Trap(marker), protocol=protocol))
    result = run_tune(table, backend, store)
    assert result.state.done and not marker.exists()
    assert len(list(store.path.glob("*.corrupt-*"))) == 1


def test_a_state_file_holding_another_key_is_quarantined(table, backend, store, tmp_path):
    from fasta_sm.backends.replay import ReplayBackend

    other = StateStore(tmp_path / "other")
    run_tune(table, ReplayBackend(table), other, key="another key")
    store.file_for(KEY).write_bytes(other.file_for("another key").read_bytes())
    result = run_tune(table, backend, store)
    assert result.state.key == KEY and not result.reused
    assert len(list(store.path.glob("*.corrupt-*"))) == 1


def test_a_dangling_symbolic_link_in_a_state_files_place_is_quarantined_not_replaced(table, backend, store, tmp_path):
    """The link may point into a volume not mounted now: the tune starts afresh, and the link is kept aside."""
    path = store.file_for(KEY)
    path.symlink_to(tmp_path / "unmounted" / path.name)
    result = run_tune(table, backend, store)
    (moved,) = store.path.glob(path.name + ".corrupt-*")
    assert moved.is_symlink() and os.readlink(moved) == str(tmp_path / "unmounted" / path.name)
    assert result.state.done and not path.is_symlink()
    assert "which does not exist" in result.state.restarts[0]


def test_two_dangling_links_set_aside_within_one_tick_of_the_clock_are_both_kept(table, backend, store, tmp_path,
                                                                               monkeypatch):
    """Path.exists() follows a link: a dangling one set aside before must not be taken for a free name."""
    monkeypatch.setattr(store_module, "_stamp", lambda: "20261204T000000.000000")  # a coarse clock
    path = store.file_for(KEY)
    for volume in ("a", "b"):
        path.symlink_to(tmp_path / volume / path.name)
        assert store.load(KEY) is None
    kept = {os.readlink(p) for p in store.path.glob(path.name + ".corrupt-*")}
    assert kept == {str(tmp_path / volume / path.name) for volume in ("a", "b")}


def test_a_thousandth_file_set_aside_within_one_tick_of_the_clock_replaces_none_before_it(store, monkeypatch):
    """The free name was looked for 999 times: then the last one tried was taken, over the file it named."""
    stamp = "20261204T000000.000000"
    monkeypatch.setattr(store_module, "_stamp", lambda: stamp)
    path = store.file_for(KEY)
    taken = [path.with_name(f"{path.name}.corrupt-{stamp}")]
    taken += [path.with_name(f"{path.name}.corrupt-{stamp}-{n}") for n in range(1, 1000)]
    for n, earlier in enumerate(taken):
        earlier.write_text(str(n))
    path.write_text("damaged")
    moved = store.quarantine(path, "a test")
    assert moved not in taken and moved.read_text() == "damaged"
    assert [earlier.read_text() for earlier in taken] == [str(n) for n in range(1000)]


# --------------------------------------------------------------------------- lock


@contextlib.contextmanager
def holding_lock(lock_path: Path):
    """Another process holds the kernel's file lock until the block ends."""
    script = textwrap.dedent(f"""
        import sys, time, filelock
        lock = filelock.FileLock({str(lock_path)!r})
        lock.acquire()
        print("held", flush=True)
        sys.stdin.read()
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


@pytest.mark.parametrize("how", ["argument", "store", "environment"])
def test_lock_wait_is_bounded_by_the_configured_timeout(how, table, backend, state_dir, monkeypatch):
    timeout = 0.75
    if how == "environment":
        monkeypatch.setenv("FASTA_SM_LOCK_TIMEOUT", str(timeout))
    store = StateStore(state_dir, lock_timeout_s=timeout if how == "store" else None)
    kw = {"lock_timeout_s": timeout} if how == "argument" else {}
    import filelock

    waits = []
    real_lock = filelock.FileLock
    monkeypatch.setattr(filelock, "FileLock", lambda path, timeout: waits.append(timeout) or real_lock(path, timeout))
    with holding_lock(store.lock_path_for(KEY)):
        with pytest.raises(LockTimeout) as caught:
            run_tune(table, backend, store, **kw)
    assert waits == [timeout]
    assert repr(table.kernel) in str(caught.value)
    assert "0.75 s" in str(caught.value)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc: a directory no file can be made in")
def test_a_lock_file_the_state_dir_cannot_hold_is_a_state_dir_error_at_once_not_a_wait_for_a_holder():
    """filelock reads an open that fails as a lock held elsewhere: without the check this waits out the timeout and
    blames another process."""
    store = StateStore("/proc/self", lock_timeout_s=30)
    with pytest.raises(StateDirError, match=r"kernel 'k': cannot create lock /proc/self/.*No such file"):
        with store.lock("k", "k"):
            pass


@pytest.mark.parametrize("make", [Path.mkdir, lambda path: path.symlink_to(path.parent / "nowhere")],
                         ids=["a directory", "a link to nothing"])
def test_something_in_a_locks_place_is_named_and_not_blamed_on_the_state_dir(make, state_dir):
    store = StateStore(state_dir, lock_timeout_s=30)
    make(store.lock_path_for("k"))
    with pytest.raises(StateDirError, match=r"stands in its place .*no tune holds it: remove it") as caught:
        with store.lock("k", "k"):
            pass
    assert "state dir is not writable" not in str(caught.value)


def test_a_lock_in_a_dir_this_process_cannot_search_blames_the_state_dir_not_a_traceback(state_dir, monkeypatch):
    """As another user's 0700 state dir does to a process that is not root: the lock's path cannot be looked at."""
    store = StateStore(state_dir, lock_timeout_s=30)
    denied = PermissionError(13, "Permission denied", str(store.lock_path_for("k")))

    def refuse(*args, **kwargs):
        raise denied

    monkeypatch.setattr(filelock.FileLock, "acquire", refuse)
    monkeypatch.setattr(os, "lstat", refuse)
    with pytest.raises(StateDirError, match=r"cannot create lock .*: state dir is not writable \(Permission denied\)"):
        with store.lock("k", "k"):
            pass


def test_a_tune_that_must_wait_for_the_lock_says_so_before_waiting(table, backend, state_dir, caplog):
    store = StateStore(state_dir, lock_timeout_s=0.2)
    with holding_lock(store.lock_path_for(KEY)), caplog.at_level("INFO", logger="fasta_sm.store"):
        with pytest.raises(LockTimeout):
            run_tune(table, backend, store)
    assert f"kernel {table.kernel}: another process is tuning it; waiting up to 0.2 s" in caplog.text


def test_a_tune_told_not_to_wait_for_the_lock_does_not_say_it_waits(table, backend, state_dir, caplog):
    store = StateStore(state_dir, lock_timeout_s=0)
    with holding_lock(store.lock_path_for(KEY)), caplog.at_level("INFO", logger="fasta_sm.store"):
        with pytest.raises(LockTimeout):
            run_tune(table, backend, store)
    assert "waiting" not in caplog.text


def test_a_waiting_tune_uses_the_result_once_the_lock_is_released(table, backend, store):
    """The holder finishes the tune; the waiter then reuses it and measures nothing."""
    import threading

    from fasta_sm.backends.replay import ReplayBackend

    counting = CountingBackend(backend)
    with holding_lock(store.lock_path_for(KEY)):
        results = []
        waiter = threading.Thread(target=lambda: results.append(run_tune(table, counting, store, lock_timeout_s=30)))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive()  # it is waiting
        other = StateStore(store.path)
        # what the lock holder does: write a finished tune (here, from a private store, copied in)
        scratch = StateStore(store.path.parent / "scratch")
        run_tune(table, ReplayBackend(table, noise=True, seed=7), scratch)
        other.write(KEY, scratch.file_for(KEY).read_bytes())
    waiter.join(timeout=30)
    assert results and results[0].reused
    assert (counting.compile_calls, counting.benchmark_calls) == (0, 0)


def test_pack_state_is_what_the_store_writes(store):
    from test_engine_state import sample_state

    state = sample_state()
    path = save(store, state)
    assert path.read_bytes() == pack_state(state)


def test_a_relative_state_dir_stays_where_it_was_after_a_chdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = StateStore("states")
    monkeypatch.chdir(tmp_path.parent)
    assert store.path == tmp_path / "states"


def test_a_directory_that_cannot_be_synced_after_the_rename_keeps_the_new_checkpoint(tmp_path, monkeypatch, caplog):
    from test_engine_state import sample_state

    store = StateStore(tmp_path / "states")
    state = sample_state()
    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = save(store, state)
    assert path.read_bytes() == pack_state(state)
    assert "could not be synced" in caplog.text


def test_a_bad_state_file_that_cannot_be_moved_aside_is_a_state_dir_error_naming_it(tmp_path):
    store = StateStore(tmp_path / "ro")
    bad = store.file_for(KEY)
    bad.write_bytes(b"not msgpack")
    with read_only_dir(store.path), pytest.raises(StateDirError, match=re.escape(str(bad))):
        store.load(KEY)


def test_two_supersedes_in_the_same_instant_keep_both_states(tmp_path, monkeypatch):
    import fasta_sm.store

    store = StateStore(tmp_path / "states")
    monkeypatch.setattr(fasta_sm.store, "_stamp", lambda: "20261201T000000.000000")
    path = store.file_for(KEY)
    path.write_bytes(b"first")
    first = store.supersede(KEY, "test")
    store.write(KEY, b"second")  # the next checkpoint replaces the name, as a tune's does
    second = store.supersede(KEY, "test")
    assert first != second and first.read_bytes() == b"first" and second.read_bytes() == b"second"


def test_a_superseded_copy_cut_short_by_a_full_disk_leaves_no_torn_file_and_the_state_in_place(tmp_path, monkeypatch):
    store = StateStore(tmp_path / "states")
    path = store.file_for(KEY)
    path.write_bytes(b"a finished tune of the old config list")

    def no_hard_links(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    def disk_full(source, copy, *args):
        copy.write(source.read(8))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", no_hard_links)
    monkeypatch.setattr(shutil, "copyfileobj", disk_full)
    with pytest.raises(StateDirError, match=rf"cannot keep outdated state file {re.escape(str(path))} .*No space left"):
        store.supersede(KEY, "its config list changed")
    assert sorted(p.name for p in store.path.iterdir()) == [path.name]
    assert path.read_bytes() == b"a finished tune of the old config list"


def test_a_state_superseded_after_the_clock_stepped_back_still_lists_as_the_newest(tmp_path, monkeypatch):
    import fasta_sm.store

    store = StateStore(tmp_path / "states")
    stamps = iter(["20261201T120000.000000", "20261201T110000.000000"])  # the clock goes back an hour
    monkeypatch.setattr(fasta_sm.store, "_stamp", lambda: next(stamps))
    store.file_for(KEY).write_bytes(b"first")
    store.supersede(KEY, "test")
    store.write(KEY, b"second")
    second = store.supersede(KEY, "test")
    assert [p.read_bytes() for p in store.superseded_files(KEY)] == [b"second", b"first"]
    assert second.name.endswith(".superseded-20261201T120000.000000-1")


@pytest.mark.parametrize("raw", ["abc", "-1", "nan", "1_0", " 5", "١٠", "infinity"])
def test_a_lock_timeout_from_the_environment_that_is_no_number_of_seconds_is_refused_naming_it(raw, monkeypatch):
    monkeypatch.setenv("FASTA_SM_LOCK_TIMEOUT", raw)
    with pytest.raises(SettingError, match=f"FASTA_SM_LOCK_TIMEOUT={raw!r}"):
        default_lock_timeout()


def test_a_lock_timeout_of_inf_from_the_environment_waits_for_ever(monkeypatch):
    monkeypatch.setenv("FASTA_SM_LOCK_TIMEOUT", "inf")
    assert default_lock_timeout() == float("inf")


@pytest.mark.parametrize("text", ["", "  "])
def test_a_lock_timeout_set_to_nothing_in_the_environment_is_the_default(text, monkeypatch):
    monkeypatch.delenv("FASTA_SM_LOCK_TIMEOUT", raising=False)
    default = default_lock_timeout()
    monkeypatch.setenv("FASTA_SM_LOCK_TIMEOUT", text)  # `FASTA_SM_LOCK_TIMEOUT= cmd` unsets it for cmd
    assert default_lock_timeout() == default


@pytest.mark.parametrize("fcntl", ["probed read-only", None], ids=["with fcntl", "without fcntl (Windows)"])
def test_is_locked_tells_a_held_lock_from_a_free_one(fcntl, table, backend, store, monkeypatch):
    run_tune(table, backend, store)
    if fcntl is None:  # the probe then takes the lock and gives it back
        monkeypatch.setattr(store_module, "fcntl", None)
    state_file = store.file_for(KEY)
    with filelock.FileLock(str(state_file.with_suffix(".lock"))):
        assert store.is_locked(state_file) is True
    assert store.is_locked(state_file) is False


def test_is_locked_answers_on_a_state_dir_it_may_not_write(table, backend, store, monkeypatch):
    run_tune(table, backend, store)
    mount_read_only(monkeypatch, store.file_for(KEY).parent)
    assert store.is_locked(store.file_for(KEY)) is False


def test_is_locked_says_it_cannot_tell_when_the_lock_file_cannot_be_opened(table, backend, store, monkeypatch):
    run_tune(table, backend, store)
    lock_path = str(store.file_for(KEY).with_suffix(".lock"))
    real_open = os.open

    def refuse(path, flags, *args, **kwargs):
        if os.fspath(path) == lock_path:
            raise PermissionError(errno.EACCES, "Permission denied", lock_path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    assert store.is_locked(store.file_for(KEY)) is None


def mount_read_only(monkeypatch, folder: Path) -> None:
    """Make every open for writing under `folder` fail as on a read-only mount (EROFS), root or not."""
    real_open = os.open

    def open_(path, flags, *args, **kwargs):
        if Path(os.fspath(path)).parent == folder and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)


def out_of_descriptors_reading(path: Path, monkeypatch) -> None:
    """Reading `path` fails as it does when the process has no file descriptor left (EMFILE)."""
    read_regular = store_module.read_regular

    def too_many_open_files(file, **kwargs):
        if file == path:
            raise OSError(errno.EMFILE, "Too many open files")
        return read_regular(file, **kwargs)

    monkeypatch.setattr(store_module, "read_regular", too_many_open_files)


def test_a_state_file_that_cannot_be_read_for_now_is_left_in_place_and_named(store, table, backend, monkeypatch):
    tune(KEY, table.kernel, table.configs, backend, policy="random", store=store)
    path = store.file_for(KEY)
    before = path.read_bytes()
    out_of_descriptors_reading(path, monkeypatch)
    with pytest.raises(StateDirError, match=re.escape(f"cannot read state file {path} for now (Too many open files)")):
        store.load(KEY)
    monkeypatch.undo()
    assert path.read_bytes() == before and not list(store.path.glob("*.corrupt-*"))


@pytest.mark.parametrize("timeout", [-1.0, math.nan, True])
def test_a_store_lock_timeout_that_is_no_wait_is_refused_naming_it(timeout, tmp_path):
    with pytest.raises(ValueError, match=re.escape(f"lock_timeout_s={timeout!r} must be a number ≥ 0")):
        StateStore(tmp_path, lock_timeout_s=timeout)


def test_superseded_files_of_one_stamp_list_the_tenth_before_the_second(store):
    name = store.file_for(KEY).name
    for suffix in ("20261202T000000.000001", "20261202T000000.000001-2", "20261202T000000.000001-10"):
        (store.path / f"{name}.superseded-{suffix}").write_bytes(b"")
    listed = [p.name.rpartition(".superseded-")[2] for p in store.superseded_files(KEY)]
    assert listed == ["20261202T000000.000001-10", "20261202T000000.000001-2", "20261202T000000.000001"]


def test_a_second_quarantine_within_one_clock_tick_keeps_the_first(store, monkeypatch):
    monkeypatch.setattr(store_module, "_stamp", lambda: "20261202T000000.000000")
    path = store.file_for(KEY)
    for content in (b"first", b"second"):
        path.write_bytes(content)
        store.quarantine(path, "damaged")
    assert sorted(p.read_bytes() for p in store.path.glob("*.corrupt-*")) == [b"first", b"second"]


def test_a_state_path_that_can_never_be_read_is_set_aside_and_the_tune_starts_afresh(store, table, backend):
    store.file_for(KEY).mkdir()  # a directory where the state file should be
    assert run_tune(table, backend, store).state.done
    assert len(list(store.path.glob("*.corrupt-*"))) == 1


def test_a_tune_whose_lock_file_is_deleted_while_held_stops_before_its_next_checkpoint(table, backend, store):
    lock_path = store.lock_path_for(KEY)

    def delete_the_lock(state):
        if len(state.durations) >= 4:
            lock_path.unlink(missing_ok=True)

    with pytest.raises(StateDirError, match=re.escape(f"its lock file {lock_path} was deleted or replaced")):
        run_tune(table, backend, store, chunk_size=4, on_step=delete_the_lock)
    kept = store.read(store.file_for(KEY))
    assert 4 <= len(kept.durations) < len(table.configs)
    assert run_tune(table, CountingBackend(backend), store).state.done  # a new lock file, and the tune goes on


def test_a_tune_whose_lock_file_is_replaced_while_held_stops_before_its_next_checkpoint(table, backend, store):
    """A new file under the lock's name is a lock another process can take: the inode, not the name, is held."""
    lock_path = store.lock_path_for(KEY)

    def replace_the_lock(state):
        if len(state.durations) >= 4 and not lock_path.with_suffix(".new").exists():
            fresh = lock_path.with_suffix(".new")
            fresh.touch()
            os.link(fresh, lock_path.with_suffix(".swap"))
            os.replace(lock_path.with_suffix(".swap"), lock_path)

    with pytest.raises(StateDirError, match=re.escape(f"its lock file {lock_path} was deleted or replaced")):
        run_tune(table, backend, store, chunk_size=4, on_step=replace_the_lock)


def test_a_tune_that_will_not_wait_is_not_refused_for_the_instant_ls_probes_its_lock(store):
    import threading

    fcntl = pytest.importorskip("fcntl", reason="flock is what ls probes with")
    lock_path = store.lock_path_for(KEY)
    lock_path.touch()
    fd = os.open(lock_path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as `is_locked` holds it, for a moment
    threading.Timer(0.01, lambda: (fcntl.flock(fd, fcntl.LOCK_UN), os.close(fd))).start()
    with store.lock(KEY, "k", timeout_s=0):
        assert store.is_locked(store.file_for(KEY))


def test_a_state_superseded_again_after_a_kill_before_the_new_tunes_first_checkpoint_is_kept_once(store):
    path = store.file_for(KEY)
    path.write_bytes(b"a finished tune of the old config list")
    first = store.supersede(KEY, "its config list changed")
    again = store.supersede(KEY, "its config list changed")  # the new tune was killed before replacing the file
    assert again == first and store.superseded_files(KEY) == [first]


def test_a_key_utf8_cannot_write_is_refused_naming_the_kernel(table, backend, store):
    with pytest.raises(ValueError, match=r"kernel 'mm_synth': key 'kern:/src/caf\\udce9.py' cannot be stored"):
        run_tune(table, backend, store, key="kern:/src/caf\udce9.py")


@pytest.mark.parametrize("kernel", ["mm_synth\udce9", b"mm_synth", None])
def test_a_kernel_name_a_state_cannot_hold_is_refused_naming_it_before_the_keys_finished_tune_is_set_aside(
    kernel, table, backend, store
):
    run_tune(table, backend, store)
    with pytest.raises(ValueError, match=rf"kernel {re.escape(repr(kernel))} cannot be stored"):
        tune(KEY, kernel, table.configs, backend, policy="exhaustive", store=store)
    assert store.set_aside_files() == []
    assert run_tune(table, backend, store).reused


def test_a_thread_that_tunes_the_key_it_is_tuning_is_told_at_once_not_after_the_lock_timeout(store):
    with store.lock(KEY, "k"):
        started = time.monotonic()
        with pytest.raises(TuneFailed, match=r"kernel 'k': this thread is tuning it already"):
            with store.lock(KEY, "k"):
                pass
        assert time.monotonic() - started < 1.0
        assert store.is_locked(store.file_for(KEY))  # the outer tune still holds its lock


def test_a_lock_another_thread_holds_is_said_to_be_held_by_a_thread_not_a_process(store):
    import threading

    held, done = threading.Event(), threading.Event()

    def hold():
        with store.lock(KEY, "k"):
            held.set()
            done.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    try:
        with pytest.raises(LockTimeout, match=r"another thread of this process has held"):
            with store.lock(KEY, "k", timeout_s=0.1):
                pass
    finally:
        done.set()
        holder.join()


def superseded_by_a_list_change(table, backend, store):
    """A tune over the first half of the table, superseded by one over the whole: the half's results kept aside."""
    half = table.configs[: len(table.configs) // 2]
    first = tune(KEY, table.kernel, half, backend, policy="exhaustive", store=store).state
    tune(KEY, table.kernel, table.configs, backend, policy="random", store=store)
    return {c.identity for i, c in enumerate(first.configs) if i in first.durations or i in first.failed}


def test_a_tune_after_its_state_was_quarantined_keeps_the_results_of_the_keys_superseded_files(table, backend, store):
    measured = superseded_by_a_list_change(table, backend, store)
    store.file_for(KEY).write_bytes(b"damaged")
    counting = CountingBackend(backend)
    result = tune(KEY, table.kernel, table.configs, counting, policy="exhaustive", store=store)
    assert result.state.done and list(store.path.glob("*.corrupt-*"))
    assert measured and not measured & {c.identity for c in counting.compiled + counting.benchmarked}
    assert any("kept from the key's superseded state files" in note for note in result.state.restarts)


def test_a_superseded_file_that_cannot_be_read_for_now_stops_the_tune_rather_than_measure_its_configs_again(
    table, backend, store, monkeypatch
):
    superseded_by_a_list_change(table, backend, store)
    (kept,) = store.superseded_files(KEY)
    store.file_for(KEY).unlink()
    out_of_descriptors_reading(kept, monkeypatch)
    with pytest.raises(StateDirError, match=re.escape(f"cannot read state file {kept} for now")):
        tune(KEY, table.kernel, table.configs, backend, policy="exhaustive", store=store)
    assert kept.exists() and not store.file_for(KEY).exists()


@pytest.mark.parametrize("spelling", ["the same path", "a symbolic link", "a path through .."])
def test_a_tune_started_from_inside_a_tune_of_the_same_key_fails_at_once_whichever_store_object_it_uses(
    spelling, table, backend, store, tmp_path
):
    # docs/reliability.md: a thread that tunes the key it is tuning is told at once, "whichever store object it
    # uses"; a store over another name of the same dir locks the same file, so it must not wait for itself.
    store.path.mkdir(parents=True, exist_ok=True)
    other_name = store.path
    if spelling == "a symbolic link":
        other_name = tmp_path / "states-link"
        other_name.symlink_to(store.path)
    elif spelling == "a path through ..":
        other_name = store.path / ".." / store.path.name
    inner: list[BaseException] = []

    def tune_again(state):
        if not inner:
            try:
                other = StateStore(other_name, lock_timeout_s=2.0)
                tune(KEY, table.kernel, table.configs, backend, policy="random", store=other)
            except BaseException as exc:  # noqa: BLE001  the spec is what it raised
                inner.append(exc)

    started = time.monotonic()
    run_tune(table, backend, store, on_step=tune_again)
    assert isinstance(inner[0], TuneFailed) and "this thread is tuning it already" in str(inner[0])
    assert time.monotonic() - started < 2.0


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
def test_a_named_pipe_in_place_of_a_state_file_is_set_aside_not_waited_on(table, backend, store):
    os.mkfifo(store.file_for(KEY))
    with pytest.raises(store_module.StateFileError, match="not a regular file"):
        store.read(store.file_for(KEY))
    result = run_tune(table, backend, store)
    assert result.state.done and len(list(store.path.glob("*.corrupt-*"))) == 1


@contextlib.contextmanager
def address_space_limited_to(spare_bytes: int):
    """This process may map at most `spare_bytes` more than it has mapped now (Linux), as on a machine whose memory
    a file far exceeds; the limit is lifted again on leaving."""
    resource = pytest.importorskip("resource")
    status = Path("/proc/self/status")
    if not status.exists():
        pytest.skip("needs /proc/self/status to tell the address space in use")
    mapped_kib = next(int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped_kib * 1024 + spare_bytes
    if hard != resource.RLIM_INFINITY and hard < limit:
        pytest.skip("the address space is limited already")
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_a_state_file_larger_than_memory_is_set_aside_not_left_to_fail_every_tune(table, backend, store, caplog):
    path = store.file_for(KEY)
    with open(path, "wb") as sparse:  # a damaged file's size: no disk is used, and no state comes near it
        sparse.truncate(64 << 30)
    with address_space_limited_to(1 << 30):
        result = run_tune(table, backend, store)
    assert result.state.done and not result.reused
    (aside,) = store.set_aside_files()
    assert aside.stat().st_size == 64 << 30 and "larger than any state file" in caplog.text


def test_a_state_file_is_opened_in_binary_mode_where_the_platform_has_one(tmp_path, monkeypatch):
    """On Windows an os.open without O_BINARY reads in text mode: CR LF as LF, and a 0x1A byte as the end of the
    file, which would cut a state file (binary msgpack) and a replay table short."""
    from fasta_sm import files

    monkeypatch.setattr(os, "O_BINARY", 0x8000, raising=False)  # Windows' value; no such flag here is 0
    flags, opened = [], os.open
    monkeypatch.setattr(os, "open", lambda path, flag, *a: flags.append(flag) or opened(path, flag & ~0x8000, *a))
    (tmp_path / "f").write_bytes(b"\r\n\x1a.")
    assert files.read_regular(tmp_path / "f") == b"\r\n\x1a." and flags[0] & 0x8000


@pytest.mark.parametrize("stage", ["read", "decode"])
def test_a_state_file_that_cannot_be_read_for_lack_of_memory_is_left_in_place_and_named(
        stage, store, table, backend, monkeypatch):
    # docs/state-format.md: "A file it cannot read for now (too many open files, an I/O error, no memory) is left
    # where it is, and the tune stops with StateDirError naming it"
    from fasta_sm import state as state_module

    tune(KEY, table.kernel, table.configs, backend, policy="random", store=store)
    path = store.file_for(KEY)
    before = path.read_bytes()

    def out_of_memory(*args, **kwargs):
        raise MemoryError

    if stage == "read":
        monkeypatch.setattr(store_module, "read_regular", out_of_memory)
    else:
        monkeypatch.setattr(state_module, "_decode_configs", out_of_memory)
    with pytest.raises(StateDirError, match=re.escape(f"cannot read state file {path} for now")):
        store.load(KEY)
    monkeypatch.undo()
    assert path.read_bytes() == before and not list(store.path.glob("*.corrupt-*"))
