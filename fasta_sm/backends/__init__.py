"""Backends: where timings come from (a replay table here; live Triton and NPU elsewhere)."""
