"""A new tune starts from what the finished tunes of its kernel found fast (fasta_sm.prior)."""

from __future__ import annotations

import errno
import multiprocessing
import os
import threading
import time
import zlib
from pathlib import Path

import msgpack
import pytest

import fasta_sm.store as store_module
import fasta_sm.tuner as tuner_module
from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.errors import SettingError, StateFileError
from fasta_sm.prior import PER_TUNE, earlier_winners
from fasta_sm.state import pack_state, unpack_state
from fasta_sm.store import PEEK_BYTES, StateStore
from fasta_sm.tuner import open_tune, tune

CORPUS = Path(__file__).resolve().parents[2] / "states"


def _fastest(result, count=PER_TUNE):
    state = result.state
    return sorted(state.durations, key=lambda i: (state.mean_us(i), i))[:count]


def _r1(result):
    return result.state.rounds[0]


def test_a_new_tune_takes_the_fastest_configs_of_its_kernels_finished_tune_into_r1(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    second = tune("shape-b", "toy_mm", table.configs, ReplayBackend(table), store=store)
    assert set(_fastest(first)) <= set(_r1(second).batch)
    named = ", ".join(f"#{i}" for i in sorted(_fastest(first)))
    assert _r1(second).reason.endswith(f"{PER_TUNE} that earlier tunes of the kernel found fast: {named}")


def test_the_prior_takes_the_place_of_sampled_configs_so_r1_keeps_its_size(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    alone = tune("shape-b", "toy_mm", table.configs, ReplayBackend(table), store=StateStore(state_dir / "alone"))
    tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    second = tune("shape-b", "toy_mm", table.configs, ReplayBackend(table), store=store)
    assert len(_r1(second).batch) == len(_r1(alone).batch)


def _two_finished_tunes(table, store, backend_of_older):
    """An older tune over the whole list and a newer one over its last half: their fastest configs differ."""
    older = tune("shape-a", "toy_mm", table.configs, backend_of_older, store=store)
    half = table.configs[len(table.configs) // 2:]
    newer = tune("shape-b", "toy_mm", half, ReplayBackend(table, noise=True, seed=2), seed=2, store=store,
                 prior=False)
    in_list = [table.configs.index(newer.state.configs[i]) for i in _fastest(newer)]
    assert not set(in_list) & set(_fastest(older)), "the two tunes should share no fast config"
    return _fastest(older), in_list


def _interleaved(first, second):
    return [i for pair in zip(first, second) for i in pair]


def test_earlier_winners_lists_each_tunes_fastest_before_any_tunes_second_newest_tune_first(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    older, newer = _two_finished_tunes(table, store, ReplayBackend(table, noise=True, seed=1))
    assert earlier_winners(store, "shape-c", "toy_mm", table.configs) == _interleaved(newer, older)


def test_which_tune_is_newest_is_told_by_when_it_finished_not_by_its_files_mtime(table_file, state_dir):
    """A state dir copied without its mtimes (`cp -r`, a checkout, an archive) must start the same R1."""
    table = load_table(table_file)
    store = StateStore(state_dir)
    older, newer = _two_finished_tunes(table, store, ReplayBackend(table, noise=True, seed=1))
    later = time.time() + 60
    os.utime(store.file_for("shape-a"), (later, later))  # the older tune's file, copied last
    assert earlier_winners(store, "shape-c", "toy_mm", table.configs) == _interleaved(newer, older)


def test_tunes_measured_as_the_new_one_is_come_before_newer_tunes_measured_otherwise(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    same = ReplayBackend(table, noise=True, seed=1)
    older, newer = _two_finished_tunes(table, store, same)
    assert earlier_winners(store, "shape-c", "toy_mm", table.configs, same.describe()) == _interleaved(older, newer)


def test_a_tune_is_never_its_own_prior(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    assert earlier_winners(store, "shape-a", "toy_mm", table.configs) == []


def test_finished_tunes_of_another_kernel_are_no_prior(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("shape-a", "other_kernel", table.configs, ReplayBackend(table), store=store)
    second = tune("shape-b", "toy_mm", table.configs, ReplayBackend(table), store=store)
    assert "earlier tunes" not in _r1(second).reason


def test_an_unfinished_tune_is_no_prior(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    with store.lock("shape-a", "toy_mm"):
        stopped = open_tune(store, "shape-a", "toy_mm", table.configs, ReplayBackend(table))
        stopped.drive(until=lambda s: s.phase == "R2")
        stopped.close()
    assert earlier_winners(store, "shape-b", "toy_mm", table.configs) == []


def test_the_prior_is_mapped_by_config_so_another_config_list_of_the_kernel_still_informs(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    reordered = list(reversed(table.configs))
    offered = earlier_winners(store, "shape-b", "toy_mm", reordered)
    assert [reordered[i] for i in offered] == [table.configs[i] for i in _fastest(first)]


def test_a_tune_resumed_after_another_tune_of_its_kernel_finished_keeps_the_r1_it_planned(table_file, state_dir):
    table = load_table(table_file)
    uninterrupted = tune("shape-b", "toy_mm", table.configs, ReplayBackend(table), store=StateStore(state_dir / "u"))
    store = StateStore(state_dir)
    with store.lock("shape-b", "toy_mm"):
        stopped = open_tune(store, "shape-b", "toy_mm", table.configs, ReplayBackend(table))
        stopped.drive(until=lambda s: s.phase == "R2")
        stopped.close()
    tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    resumed = tune("shape-b", "toy_mm", table.configs, ReplayBackend(table), store=store)
    assert [(r.batch, r.reason) for r in resumed.state.rounds] == [
        (r.batch, r.reason) for r in uninterrupted.state.rounds]


def test_prior_false_starts_from_the_tunes_own_sample(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    second = tune("shape-b", "toy_mm", table.configs, ReplayBackend(table), store=store, prior=False)
    assert "earlier tunes" not in _r1(second).reason


def test_the_switch_set_to_a_no_starts_every_tune_from_its_own_sample(table_file, state_dir, monkeypatch):
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    monkeypatch.setenv("FASTA_SM_PRIOR", "off")
    second = tune("shape-b", "toy_mm", table.configs, ReplayBackend(table), store=store)
    assert "earlier tunes" not in _r1(second).reason


def test_a_misspelt_switch_is_an_error_naming_it(table_file, state_dir, monkeypatch):
    table = load_table(table_file)
    monkeypatch.setenv("FASTA_SM_PRIOR", "of")
    with pytest.raises(SettingError, match=r"\$FASTA_SM_PRIOR='of'"):
        tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=StateStore(state_dir))


def test_an_unreadable_state_file_is_passed_over_and_left_where_it_is(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    garbage = state_dir / "0123456789abcdef0123456789abcdef.fsm"
    garbage.write_bytes(b"not a state")
    assert earlier_winners(store, "shape-b", "toy_mm", table.configs) == _fastest(first)
    assert garbage.read_bytes() == b"not a state"


def test_each_earlier_tune_offers_its_fastest_of_the_configs_the_new_list_holds(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    gone = set(_fastest(first))
    kept = [config for i, config in enumerate(table.configs) if i not in gone]
    offered = earlier_winners(store, "shape-b", "toy_mm", kept)
    next_fastest = _fastest(first, 2 * PER_TUNE)[PER_TUNE:]
    assert [kept[i] for i in offered] == [table.configs[i] for i in next_fastest]


def test_a_state_file_larger_than_msgpacks_buffer_is_passed_over(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    with open(state_dir / ("f" * 32 + ".fsm"), "wb") as big:
        big.truncate(101 * 2**20)  # msgpack's default buffer holds 100 MiB
    assert earlier_winners(store, "shape-b", "toy_mm", table.configs) == _fastest(first)


def test_a_key_longer_than_the_quick_looks_head_still_names_its_kernel(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    long_key = "k" * (PEEK_BYTES + 1)
    first = tune(long_key, "toy_mm", table.configs, ReplayBackend(table), store=store)
    assert StateStore.read_kernel(store.file_for(long_key)) == "toy_mm"
    assert earlier_winners(store, "shape-b", "toy_mm", table.configs) == _fastest(first)


def test_a_stray_file_whose_first_field_runs_past_any_key_is_passed_over_unread(table_file, state_dir, monkeypatch):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    with open(state_dir / ("e" * 32 + ".fsm"), "wb") as stray:  # a map whose first string claims 4 GiB
        stray.write(bytes([0x81, 0xC6, 0xFF, 0xFF, 0xFF, 0xF0]))
        stray.truncate(64 * 2**20)
    reads = []
    read_regular = store_module.read_regular
    monkeypatch.setattr(store_module, "read_regular", lambda path, limit=-1, **kw:
                        reads.append((Path(path).name, limit)) or read_regular(path, limit, **kw))
    assert earlier_winners(store, "shape-b", "toy_mm", table.configs) == _fastest(first)
    stray_reads = [limit for name, limit in reads if name.startswith("eeee")]
    assert stray_reads and all(0 < limit <= store_module.PEEK_MOST_BYTES for limit in stray_reads)


@pytest.mark.parametrize("failing_read", [1, 2], ids=["the quick look", "the decode"])
def test_a_file_that_cannot_be_read_for_now_is_read_again_next_time(table_file, state_dir, monkeypatch, failing_read):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    reads = []
    read_regular = store_module.read_regular

    def out_of_descriptors_once(path, *args, **kwargs):
        reads.append(path)
        if len(reads) == failing_read:
            raise OSError(errno.EMFILE, "Too many open files")
        return read_regular(path, *args, **kwargs)

    monkeypatch.setattr(store_module, "read_regular", out_of_descriptors_once)
    assert earlier_winners(store, "shape-b", "toy_mm", table.configs) == []
    assert earlier_winners(store, "shape-b", "toy_mm", table.configs) == _fastest(first)


def test_threads_starting_tunes_at_once_get_the_same_prior(table_file, state_dir, monkeypatch):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    decoding, read = threading.Event(), StateStore.read_finished

    def slow_read(path):
        decoding.set()
        time.sleep(0.2)
        return read(path)

    monkeypatch.setattr(StateStore, "read_finished", staticmethod(slow_read))
    offered = {}

    def offer(name):
        offered[name] = earlier_winners(store, name, "toy_mm", table.configs)

    early = threading.Thread(target=offer, args=("shape-b",))
    early.start()
    assert decoding.wait(5)
    offer("shape-c")
    early.join()
    assert offered == {"shape-b": _fastest(first), "shape-c": _fastest(first)}


def test_the_integrations_wrapper_gives_no_prior_slot_to_a_config_it_measures_anyway(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    wrapped = {"inner": "fasta", "must": _fastest(first)[:1]}
    alone = tune("shape-b", "toy_mm", table.configs, ReplayBackend(table), policy="must-measure",
                 policy_params=wrapped, store=StateStore(state_dir / "alone"))
    second = tune("shape-b", "toy_mm", table.configs, ReplayBackend(table), policy="must-measure",
                  policy_params=wrapped, store=store)
    assert len(_r1(second).batch) == len(_r1(alone).batch)
    assert set(_fastest(first)) <= set(_r1(second).batch)


def test_the_integrations_wrapper_around_a_policy_that_takes_no_prior_reads_no_earlier_tune(
        table_file, state_dir, monkeypatch):
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    monkeypatch.setattr(tuner_module, "earlier_winners", lambda *args: pytest.fail("the prior was read"))
    second = tune("shape-b", "toy_mm", table.configs, ReplayBackend(table), policy="must-measure",
                  policy_params={"inner": "random", "must": [0]}, store=store)
    assert second.state.done


def test_policies_that_take_no_prior_plan_as_they_always_did(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    alone = tune("shape-b", "toy_mm", table.configs, ReplayBackend(table), policy="random",
                 store=StateStore(state_dir / "alone"))
    second = tune("shape-b", "toy_mm", table.configs, ReplayBackend(table), policy="random", store=store)
    assert _r1(second).batch == _r1(alone).batch


def test_every_corpus_state_names_its_kernel_in_the_fields_a_quick_look_reads():
    corpus = sorted(CORPUS.glob("*.fsm"))
    assert corpus
    for path in corpus:
        assert StateStore.read_kernel(path) == unpack_state(path.read_bytes()).kernel, path.name


@pytest.mark.parametrize("blob", [b"", b"not a state", b"\x93\x01\x02\x03", b"\x82\xa3key\xa1k\xa6kernel\x07"],
                         ids=["empty", "text", "a list", "a kernel that is a number"])
def test_a_quick_look_at_bytes_that_are_no_state_finds_no_kernel(blob, tmp_path):
    path = tmp_path / "x.fsm"
    path.write_bytes(blob)
    assert StateStore.read_kernel(path) is None


# Python ≥ 3.12 warns of forking with a live thread, which is the point here
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_while_another_thread_reads_the_prior_tunes_with_a_prior_of_its_own(
    table_file, state_dir, monkeypatch
):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    parent, reading, finish = os.getpid(), threading.Event(), threading.Event()
    read = StateStore.read_finished

    def read_held_in_the_parent(path):
        if os.getpid() == parent:
            reading.set()
            finish.wait(10)
        return read(path)

    monkeypatch.setattr(StateStore, "read_finished", staticmethod(read_held_in_the_parent))
    reader = threading.Thread(target=earlier_winners, args=(store, "shape-b", "toy_mm", table.configs))
    reader.start()
    assert reading.wait(5)

    def child() -> None:
        second = tune("shape-c", "toy_mm", table.configs, ReplayBackend(table), store=StateStore(state_dir))
        os._exit(0 if set(_fastest(first)) <= set(_r1(second).batch) else 3)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(20)
    hung = process.is_alive()
    if hung:
        process.kill()
    finish.set()
    reader.join()
    assert not hung, "the child waited forever on a lock its parent's thread held at the fork"
    assert process.exitcode == 0


def _finished_file(table_file, state_dir) -> Path:
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("shape-a", "toy_mm", table.configs, ReplayBackend(table), store=store)
    return store.file_for("shape-a")


def test_a_finished_tune_read_for_the_prior_is_what_its_full_decode_tells(table_file, state_dir):
    path = _finished_file(table_file, state_dir)
    whole = StateStore.read(path)
    light = StateStore.read_finished(path)
    fastest = sorted(whole.durations, key=lambda i: (whole.mean_us(i), i))
    assert light.key == whole.key and light.backend == whole.backend
    assert [c.identity for c in light.fastest] == [whole.configs[i].identity for i in fastest]
    assert light.finished_at == whole.rounds[-1].finished


def test_a_finished_tune_whose_timings_are_keyed_by_decimal_text_is_read_by_the_prior_as_by_the_full_decode(
        table_file, state_dir):
    # docs/state-format.md: an index written as its decimal text, "1", is read as that index
    path = _finished_file(table_file, state_dir)
    data = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    data["durations"] = {str(index): timings for index, timings in data["durations"].items()}
    del data["crc32"]
    body = b"".join(msgpack.packb(name) + msgpack.packb(value) for name, value in data.items())
    crc = msgpack.packb("crc32") + msgpack.packb(zlib.crc32(body))
    path.write_bytes(msgpack.Packer().pack_map_header(len(data) + 1) + body + crc)
    whole = StateStore.read(path)
    fastest = sorted(whole.durations, key=lambda i: (whole.mean_us(i), i))
    light = StateStore.read_finished(path)
    assert [c.identity for c in light.fastest] == [whole.configs[i].identity for i in fastest]


def test_an_unfinished_tune_offers_nothing_to_the_prior(table_file, state_dir):
    path = _finished_file(table_file, state_dir)
    state = StateStore.read(path)
    state.phase = "R2"
    path.write_bytes(pack_state(state))
    assert StateStore.read_finished(path) is None


def test_a_damaged_finished_tune_is_refused_by_the_prior_naming_its_file(table_file, state_dir):
    path = _finished_file(table_file, state_dir)
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(StateFileError, match=str(path)):
        StateStore.read_finished(path)


def test_a_finished_tune_whose_timings_name_a_config_past_its_list_is_refused_by_the_prior(table_file, state_dir):
    path = _finished_file(table_file, state_dir)
    state = StateStore.read(path)
    state.durations[len(state.configs)] = [1.0]
    path.write_bytes(pack_state(state))
    with pytest.raises(StateFileError, match="outside the list"):
        StateStore.read_finished(path)


def _repacked(data: dict, crc: bool = True) -> bytes:
    body = b"".join(msgpack.packb(name) + msgpack.packb(value) for name, value in data.items())
    tail = msgpack.packb("crc32") + msgpack.packb(zlib.crc32(body)) if crc else b""
    return msgpack.Packer().pack_map_header(len(data) + crc) + body + tail


@pytest.mark.parametrize(
    ("change", "crc"),
    [
        (lambda data: None, False),  # a schema 3 file that lost its checksum
        (lambda data: data["durations"][min(data["durations"])].__setitem__(0, -1.0), True),
        (lambda data: data["durations"][min(data["durations"])].__setitem__(0, float("nan")), True),
        (lambda data: data.__setitem__("schema", True), True),
        (lambda data: data.__setitem__("best", min(set(range(len(data["configs"]))) - set(data["durations"]))), True),
        (lambda data: data["rounds"][-1].__setitem__("finished", float("nan")), True),
    ],
    ids=["no-checksum", "negative-timing", "nan-timing", "schema-true", "best-never-timed", "nan-finish-time"],
)
def test_a_finished_tune_its_full_decode_refuses_is_refused_by_the_prior_too(table_file, state_dir, change, crc):
    path = _finished_file(table_file, state_dir)
    data = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    del data["crc32"]
    change(data)
    path.write_bytes(_repacked(data, crc))
    with pytest.raises(StateFileError):
        StateStore.read(path)
    with pytest.raises(StateFileError):
        StateStore.read_finished(path)
