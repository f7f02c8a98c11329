"""The live backend: compile outcomes, timings, reset/restore of mutated arguments, failures."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from kernels import accumulate_kernel, grid
from triton_device import DEVICE, HAS_CUDA

from fasta_sm.config import Config
from fasta_sm.errors import SettingError, notes_of
from fasta_sm.protocols import Backend, CompileOutcome
from fasta_sm.store import StateStore
from fasta_sm.triton import compile_pool
from fasta_sm.triton.backend import TritonBackend, interpreting
from fasta_sm.triton.compile_pool import CompilePool, pool_size
from fasta_sm.triton.worker import CompileJob, TensorArg, WorkerResult, describe_error

N = 1000


def make_backend(**options):
    x = torch.randn(N, device=DEVICE)
    out = torch.zeros(N, device=DEVICE)
    return TritonBackend(accumulate_kernel, (x, out, N, 2.0), grid, rep_ms=0.0, **options), x, out


def configs(*blocks):
    return [Config({"BLOCK": b}, num_warps=1, num_stages=1) for b in blocks]


def test_is_a_backend_and_times_every_config():
    backend, _, _ = make_backend()
    assert isinstance(backend, Backend)
    assert "triton" in backend.describe()
    compiled = backend.compile(configs(64, 128))
    assert [c.error for c in compiled] == [None, None]
    outcome = backend.benchmark(configs(64, 128), repeat=[0, 0])
    assert len(outcome.durations_us) == 2 and outcome.errors == {}
    assert all(math.isfinite(d) and d > 0 for d in outcome.durations_us)


def test_reset_to_zero_makes_each_timed_launch_start_from_zero():
    backend, x, out = make_backend(reset_to_zero=["out_ptr"])
    backend.benchmark(configs(128))
    torch.testing.assert_close(out, 2.0 * x)


def test_without_reset_the_output_accumulates():
    backend, x, out = make_backend()
    backend.benchmark(configs(128))
    assert not torch.allclose(out, 2.0 * x)


def test_restore_value_puts_the_argument_back_after_every_launch():
    backend, _, out = make_backend(restore_value=["out_ptr"])
    out.copy_(torch.arange(N, dtype=out.dtype, device=DEVICE))
    before = out.clone()
    backend.benchmark(configs(64, 256))
    torch.testing.assert_close(out, before)


def test_user_hooks_replace_the_default_reset_and_restore():
    calls = []
    backend, x, out = make_backend(
        reset_to_zero=["out_ptr"],
        restore_value=["out_ptr"],
        pre_hook=lambda nargs: calls.append(("pre", nargs["BLOCK"])),
        post_hook=lambda nargs, exception: calls.append(("post", exception)),
    )
    out.copy_(torch.arange(N, dtype=out.dtype, device=DEVICE))
    before = out.clone()
    backend.benchmark(configs(128))
    assert ("pre", 128) in calls and ("post", None) in calls
    assert not torch.allclose(out, 2.0 * x), "the default reset ran: out was zeroed before a launch"
    assert not torch.allclose(out, before), "the default restore ran: out was put back after a launch"


def failing_ahead(backend):
    """`backend` as on a GPU, where each config compiles before it is timed, and every compile ahead fails."""
    backend.interpreting = False
    backend._jobs = lambda configs: None
    backend._compile_here = lambda configs: [CompileOutcome(error="CompilationError: dot of [1, 1]", seconds=0.1)
                                             for _ in configs]
    return backend


def test_a_config_whose_own_pre_hook_may_set_what_it_compiles_as_is_left_to_its_timed_launch_when_ahead_fails():
    """A TMA kernel's config pre_hook sets its descriptors' block shape: compiled without it, the config fails."""
    hooked, plain = configs(64, 128)
    backend = failing_ahead(make_backend(config_pre_hooks={hooked.identity: lambda nargs: None})[0])
    refused = "CompilationError: dot of [1, 1]"
    assert [o.error for o in backend.compile([hooked, plain])] == [None, refused]
    assert [o.error for o in backend.compile_first([hooked, plain]).values()] == [None, refused]


@pytest.mark.parametrize("hook", ["pre_hook", "post_hook"])
def test_with_a_tune_hook_every_config_that_fails_ahead_is_left_to_its_timed_launch(hook):
    """A post_hook is told of a config's failure (`exception=`) as Triton tells it, from the timed launch."""
    backend = failing_ahead(make_backend(**{hook: lambda *args, **kwargs: None})[0])
    assert [o.error for o in backend.compile(configs(64, 128))] == [None, None]


def test_without_hooks_a_config_that_fails_ahead_is_failed_there():
    backend = failing_ahead(make_backend()[0])
    assert [o.error for o in backend.compile(configs(64))] == ["CompilationError: dot of [1, 1]"]


def test_custom_do_bench_is_called_like_triton_calls_it():
    seen = []

    def do_bench(kernel_call, quantiles):
        kernel_call()
        seen.append(quantiles)
        return [0.5, 0.4, 0.6]

    backend, _, _ = make_backend(do_bench=do_bench)
    outcome = backend.benchmark(configs(64))
    assert seen == [(0.5, 0.2, 0.8)]
    assert outcome.durations_us == [500.0]


def test_a_config_a_custom_do_bench_times_as_infinite_is_failed_saying_so():
    def do_bench(kernel_call, quantiles):
        kernel_call()
        return [float("inf")] * 3

    backend, _, _ = make_backend(do_bench=do_bench)
    outcome = backend.benchmark(configs(64))
    assert math.isinf(outcome.durations_us[0]) and outcome.errors == {0: "do_bench returned inf"}


def test_a_config_that_cannot_run_is_failed_not_raised():
    backend, _, _ = make_backend()
    outcome = backend.benchmark(configs(24, 64))  # arange needs a power of two
    assert math.isinf(outcome.durations_us[0]) and math.isfinite(outcome.durations_us[1])
    assert 0 in outcome.errors and 1 not in outcome.errors


def test_an_error_timing_a_config_that_is_not_the_configs_fault_keeps_its_type_and_names_the_config():
    def broken(nargs):
        raise RuntimeError("hook broke")

    backend, _, _ = make_backend(pre_hook=broken)
    with pytest.raises(RuntimeError, match="hook broke") as raised:
        backend.benchmark(configs(128))
    assert notes_of(raised.value) == ["fasta-sm: while timing config BLOCK=128 w1 s1"]


def test_describe_error_is_one_short_line():
    text = describe_error(ValueError("out of resource:\n  shared memory " + "x" * 1000))
    assert text.startswith("ValueError: out of resource: shared memory")
    assert "\n" not in text and len(text) <= 400


@pytest.mark.parametrize("raw", ["abc", "0", "1_0", "١٠", " 3"])
def test_a_pool_size_from_the_environment_that_is_no_whole_number_is_refused_naming_it(raw, monkeypatch):
    monkeypatch.setenv("FASTA_COMPILE_WORKERS", raw)
    with pytest.raises(SettingError, match=f"FASTA_COMPILE_WORKERS={raw!r}"):
        pool_size()


@pytest.mark.parametrize("text", ["", "  "])
def test_a_pool_size_set_to_nothing_in_the_environment_is_the_default(text, monkeypatch):
    monkeypatch.delenv("FASTA_COMPILE_WORKERS", raising=False)
    default = pool_size()
    monkeypatch.setenv("FASTA_COMPILE_WORKERS", text)
    assert pool_size() == default


def test_pool_size_follows_the_environment(monkeypatch):
    monkeypatch.setenv("FASTA_COMPILE_WORKERS", "3")
    assert pool_size() == 3
    monkeypatch.delenv("FASTA_COMPILE_WORKERS")
    assert pool_size() >= 1


def test_the_default_pool_size_reads_the_cores_once_per_process(monkeypatch):
    """A warm start's first launch asks for the pool's size; the cgroup's files were read at decoration."""
    monkeypatch.delenv("FASTA_COMPILE_WORKERS", raising=False)
    first = pool_size()
    monkeypatch.setattr(compile_pool, "usable_cores", lambda: pytest.fail("the cores were read again"))
    assert pool_size() == first


def test_spawn_workers_report_every_job():
    """Workers import the kernel by module path; a failure comes back as data, in any order."""
    pool = CompilePool(2)
    f32 = TensorArg("torch.float32")
    try:
        jobs = [
            CompileJob("kernels", "accumulate_kernel", (f32, f32, N, 2.0), {"BLOCK": b, "num_warps": 1})
            for b in (64, 128)
        ] + [CompileJob("kernels", "no_such_kernel", (), {})]
        results = sorted(pool.run(jobs))
    finally:
        pool.close()
    assert [index for index, _, _ in results] == [0, 1, 2]
    assert results[2][1].startswith("AttributeError")
    if HAS_CUDA:
        assert results[0][1] is None and results[1][1] is None
    assert all(seconds >= 0 for _, _, seconds in results)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_compiles_in_workers_and_loads_in_the_parent():
    from fasta_sm.triton import zoo

    spec = zoo.spec_mm_fp16(M=512, N=512, K=512)
    args = spec.make_args("cuda")
    pool = CompilePool(4)
    pool.start()  # a ready pool: the workers compile, not threads of this process
    here, run = [], pool.run

    def run_watching_this_process(jobs, started=None, in_process=None, detach=None):
        def watched(position):
            here.append(position)
            return in_process(position)

        return run(jobs, started, in_process=watched if in_process else None, detach=detach)

    pool.run = run_watching_this_process
    backend = TritonBackend(spec.fn, args, spec.grid, spec.kwargs, pool=pool)
    space = [c for c in spec.configs if c.kwargs["BLOCK_M"] == 256 and c.num_stages == 4][:4]
    space += spec.configs[:4]
    outcomes = backend.compile(space)
    assert here == [], "a config was compiled in this process, not in a worker"
    assert any(o.error is None for o in outcomes)
    assert all(o.error is None or "OutOfResources" in o.error for o in outcomes)
    ok = [c for c, o in zip(space, outcomes) if o.error is None]
    timed = backend.benchmark(ok)
    assert all(math.isfinite(d) for d in timed.durations_us)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_workers_compile_into_the_cache_the_program_set_after_the_pool_started(tmp_path, monkeypatch):
    """Else the tuning process finds none of their binaries and compiles every config again itself."""
    from triton import knobs

    from fasta_sm.triton import zoo

    spec = zoo.spec_mm_fp16(M=512, N=512, K=512)
    args = spec.make_args("cuda")
    at_start, set_later = tmp_path / "at_start", tmp_path / "set_later"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(at_start))
    pool = CompilePool(2)
    try:
        pool.start()
        with knobs.cache.scope():
            knobs.cache.dir = str(set_later)
            outcomes = TritonBackend(spec.fn, args, spec.grid, spec.kwargs, pool=pool).compile(spec.configs[:3])
    finally:
        pool.close()
    assert [o.error for o in outcomes] == [None, None, None]
    assert not list(at_start.rglob("*.cubin"))
    assert len(list(set_later.rglob("*.cubin"))) == 3


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_out_of_shared_memory_failure_carries_the_figures_the_fasta_policy_reads():
    from fasta_sm.failures import shared_memory_overshoot
    from fasta_sm.triton import zoo

    spec = zoo.spec_mm_fp16(M=512, N=512, K=512)
    backend = TritonBackend(spec.fn, spec.make_args("cuda"), spec.grid, spec.kwargs)
    # 256 x 256 x 128 fp16 tiles held over 3 pipeline stages: 384 KiB, past any GPU's shared memory
    too_big = Config(kwargs={"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=8, num_stages=4)
    (outcome,) = backend.compile([too_big])
    assert outcome.error is not None
    assert shared_memory_overshoot({0: outcome.error}, 1)[0] > 1.0, outcome.error


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_a_config_past_the_devices_shared_memory_fails_in_its_worker_before_a_binary_is_built(
    tmp_path, monkeypatch
):
    from fasta_sm.triton import zoo

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # the workers take it as the pool starts
    spec = zoo.spec_mm_fp16(M=512, N=512, K=512)
    pool = CompilePool(2)
    pool.start()
    try:
        backend = TritonBackend(spec.fn, spec.make_args("cuda"), spec.grid, spec.kwargs, pool=pool)
        too_big = Config(kwargs={"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=8,
                         num_stages=4)
        (outcome,) = backend.compile([too_big])
    finally:
        pool.close()
    assert outcome.error is not None and "shared memory" in outcome.error, outcome.error
    assert list(tmp_path.rglob("*.llir")), "the worker did not compile the config"
    assert not list(tmp_path.rglob("*.cubin")), "the worker built the binary of a config that cannot load"
    assert backend._load(too_big, 0.0).error == outcome.error  # compiled in full here, refused at load


def test_workers_die_with_a_killed_parent():
    """A tune killed with SIGKILL leaves no compile workers behind (nor holds its caller's pipes)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    child = subprocess.run([sys.executable, str(Path(__file__).parent / "pool_child.py")],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 9, child.stderr[-2000:]
    pids = [int(pid) for pid in child.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in pids if Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)]
    assert not alive


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_multiprocessing_child_that_tuned_exits_when_its_target_returns(method):
    """multiprocessing joins a child's own children (its compile workers) before the threading exit hooks that
    close its pool run: the workers, which end with the pool, must not be waited for forever."""
    import multiprocessing
    import sys
    from pathlib import Path

    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {method} here")
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from pool_child import tune_and_return
    finally:
        sys.path.pop(0)
    child = multiprocessing.get_context(method).Process(target=tune_and_return)
    child.start()
    child.join(60)
    exited = not child.is_alive()
    if not exited:
        child.kill()
        child.join()
    assert exited and child.exitcode == 0


def test_workers_take_the_environment_of_the_tuning_process_as_the_pool_starts(monkeypatch):
    """Not the fork server's, which may have started at import, before the program set TRITON_CACHE_DIR."""
    from fasta_sm.triton import fork_server

    monkeypatch.setenv("FASTA_TEST_PROBE", "at the server's start")
    fork_server.worker_context()
    fork_server._server.ensure_running()  # as `start_fork_server` does at decoration, outside the interpreter
    monkeypatch.setenv("FASTA_TEST_PROBE", "at the pool's start")
    pool = CompilePool(1)
    try:
        pool.start()
        error = pool.submit(CompileJob("worker_probe", "env_probe", (), {"name": "FASTA_TEST_PROBE"})).result(60).error
    finally:
        pool.close()
    assert error == "RuntimeError: FASTA_TEST_PROBE=at the pool's start"


def test_workers_import_a_kernel_module_from_a_path_the_program_added_after_they_started(tmp_path, monkeypatch):
    from fasta_sm.triton.worker import module_root

    pool = CompilePool(1)
    try:
        pool.start()
        (tmp_path / "late_kernels.py").write_text(
            "class _Probe:\n"
            "    def warmup(self, *args, **kwargs):\n"
            "        raise RuntimeError('imported')\n\n\n"
            "probe = _Probe()\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        import late_kernels  # noqa: F401  the tuning process can import it; the running workers could not

        without = pool.submit(CompileJob("late_kernels", "probe", (), {})).result(60).error
        with_root = pool.submit(CompileJob("late_kernels", "probe", (), {}, root=module_root("late_kernels")))
        error = with_root.result(60).error
    finally:
        pool.close()
        sys.modules.pop("late_kernels", None)
    assert without.startswith("ModuleNotFoundError") and error == "RuntimeError: imported"


def test_a_process_exits_without_waiting_for_the_guesses_still_compiling():
    """At exit the shared pool is closed before concurrent.futures joins it, which would wait for running jobs."""
    import subprocess
    import sys
    from pathlib import Path

    # The guess takes 600 s: an exit that waited for it would outlast the timeout and fail the test.
    child = subprocess.run([sys.executable, str(Path(__file__).parent / "exit_child.py")],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0]
    except OSError:
        return "Z"


def test_a_prefetched_job_is_collected_not_compiled_again():
    """`run` awaits a future handed to it (a prefetch) instead of submitting the job again.

    Compiled again, this job would fail in the worker with its own error (it
    lacks the kernel's arguments); the prefetch's canned outcome proves it was not.
    """
    from concurrent.futures import Future

    pool = CompilePool(1)
    prefetched: Future = Future()
    prefetched.set_result(WorkerResult("ValueError: from the prefetch", 1.25))
    try:
        results = list(pool.run([CompileJob("kernels", "accumulate_kernel", (), {})], started={0: prefetched}))
    finally:
        pool.close()
    assert results == [(0, "ValueError: from the prefetch", 1.25)]


def test_a_worker_uses_the_cache_key_prefix_the_tuning_process_gives_it():
    """So that no worker hashes Triton's 500 MB library before its first compile."""
    pool = CompilePool(1)
    try:
        pool.start()
        error = pool.submit(CompileJob("worker_probe", "key_probe", (), {}, None, "fasta-test-key")).result(60).error
    finally:
        pool.close()
    assert error == "RuntimeError: key=fasta-test-key"


def test_a_worker_writes_to_the_triton_cache_the_job_names_not_the_one_it_started_with(tmp_path, monkeypatch):
    """The program may set `triton.knobs.cache.dir` or TRITON_CACHE_DIR after the pool started: the tuning
    process then loads from a cache the workers' environment does not name."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "at_start"))
    pool = CompilePool(1)
    try:
        pool.start()
        named = pool.submit(CompileJob("worker_probe", "cache_probe", (), {}, cache_dir=str(tmp_path / "now")))
        error = named.result(60).error
    finally:
        pool.close()
    assert error == f"RuntimeError: cache={tmp_path / 'now'}"


def test_a_job_that_names_no_cache_writes_to_the_workers_own_not_the_one_an_earlier_job_named(tmp_path,
                                                                                             monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "at_start"))
    pool = CompilePool(1)
    try:
        pool.start()
        pool.submit(CompileJob("worker_probe", "cache_probe", (), {}, cache_dir=str(tmp_path / "named"))).result(60)
        error = pool.submit(CompileJob("worker_probe", "cache_probe", (), {})).result(60).error
    finally:
        pool.close()
    assert error == f"RuntimeError: cache={tmp_path / 'at_start'}"


def test_a_backends_jobs_name_the_triton_cache_this_process_loads_from(tmp_path, monkeypatch):
    from triton import knobs
    from triton.runtime.jit import JITFunction

    from fasta_sm.triton import backend as backend_module

    kernel = JITFunction(getattr(accumulate_kernel, "fn", accumulate_kernel))
    monkeypatch.setattr(backend_module, "resolve", lambda module, qualname: kernel)
    x, out = torch.randn(N), torch.zeros(N)
    with knobs.cache.scope():  # puts the knob and the environment back as they were
        os.environ["TRITON_CACHE_DIR"] = str(tmp_path / "from_the_environment")
        knobs.cache.dir = str(tmp_path / "set_by_the_program")
        jobs = TritonBackend(kernel, (x, out, N, 2.0), grid)._jobs(configs(64, 128))
    assert [job.cache_dir for job in jobs] == [str(tmp_path / "set_by_the_program")] * 2


def test_a_backend_starts_no_guesses_while_its_pool_is_starting():
    """Submitting to a pool that is still spawning blocks the caller until the fork server is up."""

    class StartingPool:
        workers, ready = 6, False
        calls = 0

        def submit(self, job):
            self.calls += 1

        try_submit = submit

    pool = StartingPool()
    backend, _, _ = make_backend(pool=pool)
    backend.interpreting = False  # compiles are no-ops in the interpreter; pretend a device
    backend._jobs = lambda cs: [CompileJob("kernels", "accumulate_kernel", (), {}) for _ in cs]
    backend.prefetch(configs(1, 2, 3))
    assert pool.calls == 0


def test_a_kernel_the_workers_cannot_compile_is_compiled_in_threads_here_in_order():
    import threading
    import time

    backend, _, _ = make_backend(pool=CompilePool(2))
    backend.interpreting = False  # compiles are no-ops in the interpreter; pretend a device
    backend._jobs = lambda cs: None
    threads = set()

    def load(config, worker_seconds):
        threads.add(threading.current_thread().name)
        time.sleep(0.05)
        return CompileOutcome(error="even" if config.kwargs["BLOCK"] % 2 == 0 else None, seconds=0.05)

    backend._load = load
    outcomes = backend.compile(configs(*range(1, 17)))
    assert [o.error for o in outcomes] == ["even" if b % 2 == 0 else None for b in range(1, 17)]
    assert len(threads) > 1 and all(name.startswith("fasta-compile") for name in threads)


def test_while_the_pool_starts_jobs_are_compiled_in_process():
    """A cold pool takes seconds to start; a first batch must not wait for it."""
    pool = CompilePool(2)
    here = []
    jobs = [CompileJob("kernels", "accumulate_kernel", (), {}) for _ in range(6)]
    try:
        results = sorted(pool.run(jobs, in_process=lambda i: (here.append(i), (None, 0.01))[1]))
    finally:
        pool.close()
    assert [index for index, _, _ in results] == list(range(6))
    assert sorted(here) == list(range(6)) and all(error is None for _, error, _ in results)


def most_threads_at_once_while_the_pool_starts(monkeypatch, slow_pool_s: float) -> int:
    """Compile 40 jobs here while the pool never becomes ready; the most that ran at once."""
    import threading
    import time

    monkeypatch.setattr(compile_pool, "SLOW_POOL_S", slow_pool_s)
    never_ready = threading.Event()
    pool = CompilePool(2)
    pool.start = never_ready.wait
    lock, running, most = threading.Lock(), [0], [0]

    def compile_here(index):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return None, 0.05

    jobs = [CompileJob("kernels", "accumulate_kernel", (), {}) for _ in range(40)]
    try:
        assert len(list(pool.run(jobs, in_process=compile_here))) == 40
    finally:
        never_ready.set()
        pool.close()
    return most[0]


def test_a_starting_pool_gets_two_compile_threads_here(monkeypatch):
    """Each thread here slows the others (the GIL): while the pool starts, two threads compile."""
    assert most_threads_at_once_while_the_pool_starts(monkeypatch, slow_pool_s=1e6) == 2


def test_a_pool_slow_to_start_gets_eight_compile_threads_here(monkeypatch):
    """A pool that takes long to start leaves more of the work to this process."""
    assert most_threads_at_once_while_the_pool_starts(monkeypatch, slow_pool_s=0.0) == 8


def test_once_the_pool_is_ready_jobs_go_to_the_workers():
    pool = CompilePool(2)
    here = []
    jobs = slow_jobs(0.0, 0.0, 0.0, 0.0)  # each refused in its worker: a config failure, recorded there
    try:
        pool.start()
        results = sorted(pool.run(jobs, in_process=lambda i: (here.append(i), (None, 0.01))[1]))
    finally:
        pool.close()
    assert here == []
    assert [index for index, _, _ in results] == list(range(4))
    assert all(error.startswith("OutOfResources") for _, error, _ in results)


def run_in_ready_pool(qualname, count=3):
    """`count` jobs of `qualname` through a started pool; (results, the positions compiled in this process)."""
    pool = CompilePool(2)
    here = []
    jobs = [CompileJob("kernels", qualname, (), {}) for _ in range(count)]
    try:
        pool.start()
        results = sorted(pool.run(jobs, in_process=lambda i: (here.append(i), (None, 0.01))[1]))
    finally:
        pool.close()
    return results, sorted(here)


def test_a_job_whose_compile_raises_what_is_no_config_failure_is_compiled_in_this_process():
    """A bug outside the config (here `grid` warmed up as if a kernel) is not recorded as the config's failure."""
    results, here = run_in_ready_pool("grid")
    assert here == [0, 1, 2]
    assert results == [(0, None, 0.01), (1, None, 0.01), (2, None, 0.01)]


def test_a_job_its_worker_cannot_reach_is_compiled_in_this_process_not_failed():
    results, here = run_in_ready_pool("no_such_kernel")
    assert here == [0, 1, 2]
    assert results == [(0, None, 0.01), (1, None, 0.01), (2, None, 0.01)]


def test_only_the_job_that_kills_a_worker_when_compiled_alone_fails():
    pool = CompilePool(2)
    jobs = [CompileJob("kernels", "no_such_kernel", (), {}), CompileJob("kernels", "crash_kernel", (), {})]
    jobs += [CompileJob("kernels", "no_such_kernel", (), {}) for _ in range(3)]
    try:
        results = sorted(pool.run(jobs))
    finally:
        pool.close()
    assert [index for index, _, _ in results] == list(range(5))
    assert results[1][1] == "BrokenProcessPool: the compile worker died compiling it, alone"
    assert all(error.startswith("AttributeError") for i, error, _ in results if i != 1)


def test_a_prefetch_cancelled_by_a_pool_restart_is_compiled_again():
    from concurrent.futures import Future

    pool = CompilePool(1)
    cancelled: Future = Future()
    cancelled.cancel()
    try:
        results = list(pool.run([CompileJob("kernels", "no_such_kernel", (), {})], started={0: cancelled}))
    finally:
        pool.close()
    assert len(results) == 1 and results[0][1].startswith("AttributeError")


def _kill_a_worker(pool):
    import os
    import signal
    import time

    pid = next(iter(pool._executor._processes))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not pool._executor._broken and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool._executor._broken


def test_a_pool_broken_between_two_batches_is_restarted_not_raised():
    pool = CompilePool(2)
    jobs = [CompileJob("kernels", "no_such_kernel", (), {}) for _ in range(3)]
    try:
        pool.start()
        _kill_a_worker(pool)
        results = sorted(pool.run(jobs))
    finally:
        pool.close()
    assert [index for index, _, _ in results] == [0, 1, 2]
    assert all(error.startswith("AttributeError") for _, error, _ in results)


def test_a_worker_that_dies_while_another_compiles_breaks_the_pool_at_once():
    """The executor's manager thread watches every worker, the last one started too: a worker forked at a
    submit, after that submit woke the thread, went unwatched until another job ended (CPython 3.11.7, 3.12,
    3.13), so its jobs waited on the other worker's 30 s compile."""
    from concurrent.futures import wait
    from concurrent.futures.process import BrokenProcessPool

    pool = CompilePool(2)
    try:
        running = [pool.submit(slow_jobs(30.0)[0])]
        time.sleep(0.5)  # the manager thread waits on the workers it knows
        running.append(pool.submit(slow_jobs(30.0)[0]))
        time.sleep(0.5)
        os.kill(list(pool._executor._processes)[-1], signal.SIGKILL)  # the worker started last
        done, pending = wait(running, timeout=10)
        assert not pending, "a dead worker's jobs were still pending 10 s after it died"
        assert all(isinstance(future.exception(), BrokenProcessPool) for future in done)
    finally:
        pool.close()


def test_a_prefetch_from_a_replaced_pool_is_redone_without_a_new_restart(caplog):
    pool = CompilePool(2)
    job = CompileJob("kernels", "no_such_kernel", (), {})
    try:
        pool.start()
        old = pool.submit(job)
        old.result()
        stale = pool.submit(job)
        _kill_a_worker(pool)
        pool._reset()
        pool.start()
        caplog.clear()
        results = list(pool.run([job], started={0: stale}))
    finally:
        pool.close()
    assert len(results) == 1 and results[0][1].startswith("AttributeError")
    assert "a compile worker died" not in caplog.text


def test_a_pool_that_cannot_start_leaves_every_job_to_this_process(caplog):
    import threading
    from concurrent.futures import Future

    pool = CompilePool(2)

    def broken_start():
        raise OSError("no fork server here")

    pool.start = broken_start
    cancelled: Future = Future()
    cancelled.cancel()
    jobs = [CompileJob("kernels", "accumulate_kernel", (), {}) for _ in range(4)]
    results = []
    runner = threading.Thread(target=lambda: results.extend(
        pool.run(jobs, started={3: cancelled}, in_process=lambda i: (None, 0.01))))
    runner.start()
    runner.join(timeout=30)
    pool.close()
    assert not runner.is_alive(), "run() must not wait for a pool that cannot start"
    assert sorted(index for index, _, _ in results) == [0, 1, 2, 3]
    assert "the compile pool did not start: OSError: no fork server here" in caplog.text
    assert not pool.ready


def test_configs_compiled_in_this_process_while_the_pool_starts_are_loaded_once():
    from fasta_sm.protocols import CompileOutcome

    pool = CompilePool(2)
    backend, _, _ = make_backend(pool=pool)
    backend.interpreting = False  # the interpreter compiles nothing; pretend a device
    loads = []
    backend._load = lambda config, seconds: (loads.append(config), CompileOutcome(error=None, seconds=0.5))[1]
    space = configs(32, 64, 128, 256)
    try:
        outcomes = backend.compile(space)
    finally:
        pool.close()
    assert [o.error for o in outcomes] == [None] * 4 and all(o.seconds == 0.5 for o in outcomes)
    assert sorted(c.kwargs["BLOCK"] for c in loads) == [32, 64, 128, 256]


@pytest.mark.parametrize(("value", "expected"), [("0", False), ("false", False), ("off", False), ("no", False),
                                                 ("1", True), ("true", True), ("on", True)])
def test_triton_interpret_is_read_as_triton_reads_it(value, expected, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert interpreting() is expected


def test_a_tensor_passed_by_keyword_keeps_the_compile_in_this_process(monkeypatch):
    from triton.runtime.jit import JITFunction

    from fasta_sm.triton import backend as backend_module

    kernel = JITFunction(getattr(accumulate_kernel, "fn", accumulate_kernel))  # compiled, even beside the interpreter
    monkeypatch.setattr(backend_module, "resolve", lambda module, qualname: kernel)  # as a worker would import it
    x, out = torch.randn(N), torch.zeros(N)
    by_position = TritonBackend(kernel, (x, out, N, 2.0), grid)
    by_keyword = TritonBackend(kernel, (x,), grid, {"out_ptr": out, "n": N, "scale": 2.0})
    assert by_position._jobs(configs(64)) is not None
    assert by_keyword._jobs(configs(64)) is None


def test_a_jit_function_passed_by_keyword_keeps_the_compile_in_this_process(monkeypatch):
    from triton.runtime.jit import JITFunction

    from fasta_sm.triton import backend as backend_module

    kernel = JITFunction(getattr(accumulate_kernel, "fn", accumulate_kernel))
    monkeypatch.setattr(backend_module, "resolve", lambda module, qualname: kernel)
    x, out = torch.randn(N), torch.zeros(N)
    with_function = TritonBackend(kernel, (x, out, N, 2.0), grid, {"ACT": kernel})  # a constexpr activation
    assert with_function._jobs(configs(64)) is None


def test_a_dtype_passed_by_keyword_still_goes_to_the_workers(monkeypatch):
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    from fasta_sm.triton import backend as backend_module

    kernel = JITFunction(getattr(accumulate_kernel, "fn", accumulate_kernel))
    monkeypatch.setattr(backend_module, "resolve", lambda module, qualname: kernel)
    x, out = torch.randn(N), torch.zeros(N)
    with_dtype = TritonBackend(kernel, (x, out, N, 2.0), grid, {"OUT_DTYPE": tl.float16})
    assert with_dtype._jobs(configs(64)) is not None


def test_an_error_compiling_here_that_is_not_the_configs_fault_reaches_the_caller():
    """A thread of this process compiling while the pool starts hands on what `in_process` raises."""
    import threading

    never_ready = threading.Event()
    pool = CompilePool(2)
    pool.start = never_ready.wait

    def broken_heuristic(index):
        raise KeyError("no_such_arg")

    try:
        with pytest.raises(KeyError, match="no_such_arg"):
            list(pool.run([CompileJob("kernels", "accumulate_kernel", (), {}) for _ in range(3)],
                          in_process=broken_heuristic))
    finally:
        never_ready.set()
        pool.close()


def test_a_bug_in_a_heuristic_stops_the_tune_instead_of_failing_every_config(tmp_path):
    import triton

    import fasta_sm

    buggy = triton.heuristics({"UNUSED": lambda meta: meta["no_such_arg"]})(accumulate_kernel)
    kernel = fasta_sm.autotune([triton.Config({"BLOCK": b}, num_warps=1, num_stages=1) for b in (64, 128)],
                               key=["n"], state_dir=str(tmp_path))(buggy)
    x = torch.randn(256, device=DEVICE)
    with pytest.raises(KeyError, match="no_such_arg") as raised:
        kernel[grid](x, torch.zeros_like(x), 256, 2.0)
    assert re.fullmatch(r"fasta-sm: while (timing|loading) config BLOCK=\d+ w1 s1", notes_of(raised.value)[0])
    state = StateStore.read(next(tmp_path.glob("*.fsm")))
    assert "KeyError" in state.last_error and "config BLOCK=" in state.last_error


def test_a_backend_told_to_keep_every_failure_records_a_heuristic_bug_as_each_configs_failure(tmp_path):
    """As the recorder's backend does: the error is kept whether it surfaces at load (GPU) or at launch."""
    import triton

    from fasta_sm.errors import TuneFailed
    from fasta_sm.tuner import tune

    buggy = triton.heuristics({"UNUSED": lambda meta: meta["no_such_arg"]})(accumulate_kernel)
    x = torch.randn(256, device=DEVICE)
    backend = TritonBackend(buggy, (x, torch.zeros_like(x), 256, 2.0), grid, failures=(Exception,))
    configs = [Config({"BLOCK": b}, num_warps=1, num_stages=1) for b in (64, 128)]
    store = StateStore(tmp_path)
    with pytest.raises(TuneFailed, match="no config ran"):
        tune("k", "buggy", configs, backend, policy="exhaustive", store=store)
    failed = store.load("k").failed
    assert sorted(failed) == [0, 1] and all("no_such_arg" in error for error in failed.values())


@pytest.fixture
def start_attempts(monkeypatch):
    """Every start of a CompilePool fails; the list counts the attempts."""
    attempts = []

    def failing_start(self):
        attempts.append(1)
        raise OSError("fork server cannot start")

    monkeypatch.setattr(CompilePool, "start", failing_start)
    return attempts


def test_a_pool_that_fails_to_start_is_tried_once_per_batch_not_on_every_poll(start_attempts):
    pool = CompilePool(4)
    jobs = [CompileJob("kernels", "accumulate_kernel", (), {}) for _ in range(6)]
    try:
        results = list(pool.run(jobs, in_process=lambda i: (time.sleep(0.05), (None, 0.05))[1]))
    finally:
        pool.close()
    assert len(results) == 6 and len(start_attempts) == 1


def slow_jobs(*seconds):
    return [CompileJob("kernels", "slow_kernel", (), {"SECONDS": s}) for s in seconds]


def test_a_detaching_run_ends_at_the_first_finished_job_and_hands_over_the_rest():
    pool = CompilePool(3)
    detached = {}
    try:
        pool.start()
        results = list(pool.run(slow_jobs(3.0, 0.0, 3.0, 3.0), detach=lambda i, f: detached.setdefault(i, f)))
        assert [index for index, _, _ in results] == [1]
        assert sorted(detached) == [0, 2, 3]  # 0 and 2 in workers, 3 queued in the pool for the next free one
        later = list(pool.run(slow_jobs(3.0, 0.0, 3.0, 3.0), started={i: detached[i] for i in (0, 2, 3)}))
    finally:
        pool.close()
    assert sorted(index for index, _, _ in later) == [0, 1, 2, 3]
    assert all(error.startswith("OutOfResources: out of resource: slow stand-in") for _, error, _ in results + later)


def test_a_detaching_run_waits_for_what_this_process_compiles_and_drops_what_it_has_not_started():
    pool = CompilePool(2)
    pool.start = threading.Event().wait  # a pool that never becomes ready: two threads here do the work
    seconds = [0.0, 0.3, 0.3, 0.3]

    def compile_here(index):
        time.sleep(seconds[index])
        return None, seconds[index]

    try:
        results = sorted(pool.run(slow_jobs(*seconds), in_process=compile_here, detach=lambda i, f: None))
    finally:
        pool.close()
    # job 0 ends at once and its thread takes job 2; the run ends then: jobs 1 and 2 finish, job 3 never starts
    assert results == [(0, None, 0.0), (1, None, 0.3), (2, None, 0.3)]


def test_compile_first_returns_what_is_done_and_the_next_call_collects_the_rest():
    backend, _, _ = make_backend(pool=CompilePool(3))
    backend.interpreting = False  # compiles are no-ops in the interpreter; pretend a device
    backend._jobs = lambda cs: slow_jobs(*(c.kwargs["BLOCK"] / 1000 for c in cs))
    submitted = []
    try:
        backend.pool.start()
        # 2 s apart: a worker that starts cold (imports torch on a fresh machine) can lose a second
        first = backend.compile_first(configs(2000, 0, 4000))
        assert sorted(first) == [1]
        submit = backend.pool.submit
        backend.pool.submit = lambda job: (submitted.append(job), submit(job))[1]
        second = backend.compile_first(configs(2000, 4000))
        third = backend.compile_first(configs(4000))
    finally:
        backend.pool.close()
    assert sorted(second) == [0] and sorted(third) == [0]
    assert submitted == []  # the first call's compiles, collected later: none started again
    outcomes = [*first.values(), *second.values(), *third.values()]
    assert all(o.error.startswith("OutOfResources: out of resource: slow stand-in") for o in outcomes)


def test_a_pool_slow_to_start_gets_eight_threads_here_however_short_each_detaching_run(monkeypatch):
    """The wait is the pool's, not each run's: runs that end at their first compile still escalate."""
    monkeypatch.setattr(compile_pool, "SLOW_POOL_S", 0.2)
    never_ready = threading.Event()
    pool = CompilePool(2)
    pool.start = never_ready.wait
    lock, running, most = threading.Lock(), [0], []

    def compile_here(index):
        with lock:
            running[0] += 1
            most.append(running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return None, 0.05

    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            list(pool.run(slow_jobs(*[0.0] * 10), in_process=compile_here, detach=lambda i, f: None))
    finally:
        never_ready.set()
        pool.close()
    assert max(most) == 8


def test_a_pool_that_fails_to_start_is_not_tried_again_at_every_detaching_run(start_attempts):
    pool = CompilePool(4)
    try:
        for _ in range(5):
            list(pool.run(slow_jobs(0.0, 0.0), in_process=lambda i: (time.sleep(0.05), (None, 0.05))[1],
                          detach=lambda i, f: None))
    finally:
        pool.close()
    assert len(start_attempts) == 1


def test_a_job_started_before_close_is_done_again_not_taken_for_a_crash(caplog):
    pool = CompilePool(2)
    try:
        pool.start()
        guess = pool.try_submit(slow_jobs(1.0)[0])
        pool.close()
        results = list(pool.run(slow_jobs(1.0), started={0: guess}))
    finally:
        pool.close()
    assert [index for index, _, _ in results] == [0] and "a compile worker died" not in caplog.text


class _StubPool:
    """Just what `_Run.restart` asks of a pool."""

    workers = 2

    def replace_executor(self):
        pass


def test_a_crash_redoes_the_jobs_in_flight_but_not_one_already_finished():
    from concurrent.futures import Future

    from fasta_sm.triton.compile_pool import _Run

    finished, running = Future(), Future()
    finished.set_result(WorkerResult(None, 0.4))
    run = _Run(_StubPool(), slow_jobs(0.4, 5.0, 0.0), in_process=None)
    run.in_flight = {finished: 0, running: 1}
    run.restart([2])  # job 2 killed the worker
    assert run.in_flight == {finished: 0} and sorted(run.suspects) == [1, 2]


def test_a_pool_whose_start_failed_starts_afresh_next_time(monkeypatch):
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    made = []

    class DyingExecutor:
        """Every worker dies as it starts."""

        def __init__(self, *args, **kwargs):
            self.shut = False
            made.append(self)

        def submit(self, fn, *args):
            future = Future()
            future.set_exception(BrokenProcessPool("a worker died while the pool started"))
            return future

        def shutdown(self, wait=True, *, cancel_futures=False):
            self.shut = True

    monkeypatch.setattr(compile_pool, "ProcessPoolExecutor", DyingExecutor)
    monkeypatch.setattr(compile_pool, "warm_triton_key", lambda: None)
    pool = CompilePool(2)
    try:
        pool._start_quietly()
        assert pool._executor is None and not pool.ready and [e.shut for e in made] == [True]
    finally:
        pool.close()


def test_a_pool_that_cannot_take_work_at_interpreter_shutdown_stops_the_run_instead_of_retrying():
    class ShutDown(CompilePool):
        ready = True

        def submit(self, job):
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    pool = ShutDown(2)
    try:
        with pytest.raises(RuntimeError, match="interpreter shutdown"):
            list(pool.run(slow_jobs(0.0)))
    finally:
        pool.close()


def test_a_pool_a_caller_made_does_not_hold_the_process_at_exit_for_its_guesses():
    here = str(Path(__file__).parent)
    code = (
        f"import sys; sys.path.insert(0, {here!r})\n"
        "from fasta_sm.triton.compile_pool import CompilePool\n"
        "from fasta_sm.triton.worker import CompileJob\n"
        "pool = CompilePool(1); pool.start()\n"
        "assert pool.try_submit(CompileJob('kernels', 'slow_kernel', (), {'SECONDS': 60.0})) is not None\n"
    )
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert time.perf_counter() - started < 40  # not the guess's 60 s


def test_a_compile_worker_outlives_the_ctrl_c_a_terminal_sends_to_the_whole_process_group(caplog):
    """Ctrl-C reaches every process of the foreground group; the tuning process alone decides what it ends."""
    pool = CompilePool(2)
    try:
        pool.start()
        workers = set(pool._executor._processes)
        running = pool.submit(slow_jobs(1.0)[0])
        time.sleep(0.3)
        for pid in workers:
            os.kill(pid, signal.SIGINT)
        results = list(pool.run(slow_jobs(1.0), started={0: running}))
        assert set(pool._executor._processes) == workers
    finally:
        pool.close()
    assert [(index, error.split(":")[0]) for index, error, _ in results] == [(0, "OutOfResources")]
    assert "a compile worker died" not in caplog.text


def test_threads_whose_first_tunes_start_together_share_one_compile_pool(monkeypatch):
    made = []

    class SlowToMake:
        def __init__(self):
            time.sleep(0.05)  # long enough for every thread to look before the first pool exists
            made.append(self)

    monkeypatch.setattr(compile_pool, "_shared", None)
    monkeypatch.setattr(compile_pool, "CompilePool", SlowToMake)
    pools = []
    threads = [threading.Thread(target=lambda: pools.append(compile_pool.shared_pool())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1 and all(pool is made[0] for pool in pools)
