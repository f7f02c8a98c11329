"""Results belong to configs: a changed config list, or changed tune settings, start a new tune that keeps what was
measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from toy_table import write_table

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.config import Config
from fasta_sm.errors import PolicyError
from fasta_sm.report import tune_costs
from fasta_sm.store import StateStore
from fasta_sm.tuner import tune


def write_json(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


class CountingBackend(ReplayBackend):
    """A replay backend that remembers every config it compiled or timed."""

    def __init__(self, table):
        super().__init__(table)
        self.compiled: list[Config] = []
        self.timed: list[Config] = []

    def compile(self, configs):
        self.compiled += configs
        return super().compile(configs)

    def benchmark(self, configs, repeat=None):
        self.timed += configs
        return super().benchmark(configs, repeat)


def test_a_grown_config_list_reuses_every_earlier_result(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("k", "toy_mm", table.configs[:-6], ReplayBackend(table), policy="exhaustive", store=store)
    backend = CountingBackend(table)
    second = tune("k", "toy_mm", table.configs, backend, policy="exhaustive", store=store)
    assert backend.compiled == table.configs[-6:]
    assert set(backend.timed) <= set(table.configs[-6:])
    assert second.state.evaluations() == first.state.evaluations() + len(backend.timed)
    assert "superseded" in second.state.restarts[0] and list(state_dir.glob("*.superseded-*"))


def test_a_failure_carried_to_a_changed_config_list_keeps_its_error_text(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("k", "toy_mm", table.configs[6:], ReplayBackend(table), policy="exhaustive", store=store)
    assert first.state.failed, "the table's last configs fail to compile"
    second = tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="exhaustive", store=store)
    for index, why in first.state.failed.items():
        assert second.state.failed[table.index_of(first.state.configs[index])] == why


def test_a_changed_config_list_never_resumes_the_old_tune(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("k", "toy_mm", table.configs[:10], ReplayBackend(table), policy="exhaustive", store=store)
    result = tune("k", "toy_mm", table.configs[5:20], ReplayBackend(table), policy="exhaustive", store=store)
    assert result.state.n_configs == 15 and not result.reused


def test_bad_policy_params_with_a_changed_list_leave_the_old_state_in_place(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("k", "toy_mm", table.configs[:-6], ReplayBackend(table), policy="exhaustive", store=store)
    with pytest.raises(PolicyError, match="kernel 'toy_mm'"):
        tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="fasta", policy_params={"r1_frac": 2.0},
             store=store)
    assert not list(state_dir.glob("*.superseded-*"))
    backend = CountingBackend(table)
    tune("k", "toy_mm", table.configs, backend, policy="exhaustive", store=store)
    assert backend.compiled == table.configs[-6:]


def test_a_config_dropped_by_one_change_and_restored_by_the_next_is_not_measured_again(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="exhaustive", store=store)
    tune("k", "toy_mm", table.configs[:20], ReplayBackend(table), policy="exhaustive", store=store)
    backend = CountingBackend(table)
    tune("k", "toy_mm", table.configs, backend, policy="exhaustive", store=store)
    assert backend.compiled == [] and backend.timed == []


def test_a_crash_before_the_new_tunes_first_checkpoint_keeps_the_old_state_to_carry(table_file, state_dir,
                                                                                  monkeypatch):
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("k", "toy_mm", table.configs[:-6], ReplayBackend(table), policy="exhaustive", store=store)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(StateStore, "write", crash)
        with pytest.raises(KeyboardInterrupt):
            tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="exhaustive", store=store)
    assert store.file_for("k").exists()
    backend = CountingBackend(table)
    tune("k", "toy_mm", table.configs, backend, policy="exhaustive", store=store)
    assert backend.compiled == table.configs[-6:]


def test_a_done_tune_asked_for_with_another_seed_is_tuned_again_keeping_its_results(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="random", policy_params={"budget": 0.3},
                 seed=1, store=store)
    backend = CountingBackend(table)
    second = tune("k", "toy_mm", table.configs, backend, policy="random", policy_params={"budget": 0.3}, seed=2,
                  store=store)
    assert not second.reused and second.state.seed == 2
    assert "seed 1 → 2" in second.state.restarts[0]
    assert not set(backend.compiled) & {table.configs[i] for i in first.state.compiled}


def random_tune(table, store, seed, backend=None):
    return tune("k", "toy_mm", table.configs, backend or ReplayBackend(table), policy="random",
                policy_params={"budget": 0.3}, seed=seed, store=store)


def test_a_setting_switched_back_reuses_the_finished_tune_it_made_as_it_was(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = random_tune(table, store, seed=1)
    random_tune(table, store, seed=2)
    backend = CountingBackend(table)
    again = random_tune(table, store, seed=1, backend=backend)
    assert again.reused and backend.compiled == [] and backend.timed == []
    assert (again.state.best, again.state.durations, again.state.rounds) == (
        first.state.best, first.state.durations, first.state.rounds)


def test_the_tune_a_switched_back_setting_replaces_is_kept_superseded(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    random_tune(table, store, seed=1)
    random_tune(table, store, seed=2)
    random_tune(table, store, seed=1)
    assert [store.read(path).seed for path in store.superseded_files("k")] == [2]
    assert store.read(store.file_for("k")).seed == 1


def test_a_finished_tune_is_reinstated_in_place_of_a_key_file_set_aside_as_damaged(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = random_tune(table, store, seed=1)
    random_tune(table, store, seed=2)
    store.file_for("k").write_bytes(b"damaged")
    backend = CountingBackend(table)
    again = random_tune(table, store, seed=1, backend=backend)
    assert again.reused and backend.timed == [] and again.state.best == first.state.best
    assert list(state_dir.glob("*.corrupt-*"))


def test_a_config_list_edited_and_reverted_reuses_the_finished_tune_of_that_list(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="random", policy_params={"budget": 0.3},
                 store=store)
    tune("k", "toy_mm", table.configs[:20], ReplayBackend(table), policy="random", policy_params={"budget": 0.3},
         store=store)
    again = tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="random", policy_params={"budget": 0.3},
                 store=store)
    assert again.reused and (again.state.best, again.state.rounds) == (first.state.best, first.state.rounds)


def test_a_superseded_copy_that_will_not_go_once_its_tune_is_put_back_costs_nothing(table_file, state_dir,
                                                                                    monkeypatch, caplog):
    table = load_table(table_file)
    store = StateStore(state_dir)
    random_tune(table, store, seed=1)
    random_tune(table, store, seed=2)
    real_unlink = Path.unlink

    def stuck(path, *args, **kwargs):
        if ".superseded-" in path.name:
            raise PermissionError(13, "Permission denied")
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", stuck)
    with caplog.at_level("WARNING", logger="fasta_sm.store"):
        assert random_tune(table, store, seed=1).reused
    assert "its superseded copy" in caplog.text and "stays (Permission denied)" in caplog.text
    monkeypatch.undo()
    assert random_tune(table, store, seed=1).reused


def test_a_done_tune_asked_for_with_another_policy_is_not_reused(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="random", policy_params={"budget": 0.3},
         store=store)
    result = tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="exhaustive", store=store)
    assert not result.reused and result.state.policy == "exhaustive"
    assert len(result.state.durations) + len(result.state.failed) == len(table.configs)


def test_an_unfinished_tune_with_changed_policy_params_starts_afresh_keeping_its_results(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    with pytest.raises(KeyboardInterrupt):
        tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="fasta", store=store,
             on_step=interrupt_after(3))
    measured = set(store.load("k").compiled)
    backend = CountingBackend(table)
    result = tune("k", "toy_mm", table.configs, backend, policy="fasta", policy_params={"retime_top": 1},
                  store=store)
    assert result.state.policy_params == {"retime_top": 1} and "policy_params" in result.state.restarts[0]
    assert not set(backend.compiled) & {table.configs[i] for i in measured}


def test_the_same_settings_reuse_a_done_tune_whatever_the_sequence_type_of_a_parameter(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    params = {"bases": ("linear", "rbf"), "incumbent_basis": "rbf"}
    tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="fasta", policy_params=params, store=store)
    again = tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="fasta", policy_params=params,
                 store=store)
    assert again.reused


def interrupt_after(steps):
    """An on_step callback that stops the tune, as a kill would, after `steps` checkpoints."""
    seen = []

    def on_step(state):
        seen.append(state.position())
        if len(seen) == steps:
            raise KeyboardInterrupt

    return on_step


def test_a_tune_records_which_results_it_took_from_the_state_it_superseded(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    first = tune("k", "toy_mm", table.configs[:-6], ReplayBackend(table), policy="exhaustive", store=store).state
    second = tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="exhaustive", store=store).state
    given = {table.index_of(first.configs[i]): len(first.durations.get(i, ())) for i in (*first.compiled,
                                                                                        *first.failed)}
    assert second.carried_taken == given
    assert StateStore.read(store.file_for("k")).carried_taken == given


def test_the_exhaustive_estimate_of_a_tune_that_took_results_counts_only_what_it_spent(tmp_path, state_dir):
    data = json.loads(write_table(tmp_path / "flat.json").read_text())
    for row in data["configs"]:
        row["compile_s"] = 1.0  # every config costs the same: an estimate from any of them is exact
    table = load_table(write_json(tmp_path / "flat.json", data))
    store = StateStore(state_dir)
    tune("k", "toy_mm", table.configs[:-6], ReplayBackend(table), policy="exhaustive", store=store)
    superseding = tune("k", "toy_mm", table.configs, ReplayBackend(table), policy="exhaustive", store=store).state
    from_scratch = tune("other", "toy_mm", table.configs, ReplayBackend(table), policy="exhaustive",
                        store=store).state
    assert superseding.carried_taken and not from_scratch.carried_taken
    assert tune_costs(superseding).exhaustive_s == pytest.approx(tune_costs(from_scratch).exhaustive_s)


def test_a_key_holding_another_kernels_tune_is_set_aside_naming_both_and_the_tune_starts_afresh(table_file, state_dir):
    """A key names one kernel's tune: another kernel asking for it must neither reuse that tune nor take its
    measurements as its own, and the file is moved aside, not lost, as a file holding another key is."""
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("shape", "kernel_a", table.configs, ReplayBackend(table), policy="exhaustive", store=store)
    before = store.file_for("shape").read_bytes()
    backend = CountingBackend(table)
    result = tune("shape", "kernel_b", table.configs, backend, policy="exhaustive", store=store)
    assert not result.reused and len(backend.compiled) == len(table.configs)
    assert "holds a tune of kernel 'kernel_a', not of 'kernel_b'" in result.state.restarts[0]
    (aside,) = state_dir.glob("*.corrupt-*")
    assert aside.read_bytes() == before


def test_a_superseded_file_of_another_kernel_under_the_key_gives_a_new_tune_nothing(table_file, state_dir):
    table = load_table(table_file)
    store = StateStore(state_dir)
    tune("shape", "kernel_a", table.configs[:10], ReplayBackend(table), policy="exhaustive", store=store)
    tune("shape", "kernel_a", table.configs, ReplayBackend(table), policy="exhaustive", store=store)
    store.file_for("shape").unlink()  # only kernel_a's superseded file is left under the key
    backend = CountingBackend(table)
    result = tune("shape", "kernel_b", table.configs, backend, policy="exhaustive", store=store)
    assert not result.state.restarts and len(backend.compiled) == len(table.configs)
