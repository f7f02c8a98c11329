"""What a bench says on stderr when a run finds no config that ran."""

from __future__ import annotations

import json
import logging


def test_a_bench_run_without_a_pick_does_not_claim_a_state_file_or_a_budget_it_had(tmp_path, caplog):
    from fasta_sm.bench import bench

    rows = [{"kwargs": {"BLOCK": b}, "num_warps": 4, "num_stages": 2, "compile_s": 1.0,
             "duration_us": [] if b == 32 else [90.0, 91.0], "error": "OOR" if b == 32 else None}
            for b in (16, 32)]
    (tmp_path / "t.json").write_text(json.dumps({"kernel": "t", "shape": {}, "device": "-", "torch": "-",
                                                 "triton": "-", "configs": rows}))
    with caplog.at_level(logging.WARNING):
        report = bench(tmp_path, ["random"], seeds=6, budget=0.5)  # one config of two: some seeds draw the failing one
    assert report["overall"]["random"]["catch2"] < 1.0  # some runs found nothing
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "state kept at the last checkpoint" not in said  # a bench keeps no state
    assert "runs found no config that ran" in said
