"""Distributed input: shard="auto", InputContext, arrayfeed.distribute, and real strategies.

The strategy tests run real TensorFlow jobs in subprocesses (tests/mirrored_job.py,
tests/mw_job.py): a MirroredStrategy over two logical CPU devices (device configuration must
precede TensorFlow's device initialisation), and two-process MultiWorkerMirroredStrategy jobs on
127.0.0.1 whose every step all-reduces, under a timeout so a hang fails the test.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import arrayfeed as af
from arrayfeed import ConfigError, Shard
from arrayfeed._pipeline.plan.shard import ENV_VARIABLES

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
ENV_VARS = ENV_VARIABLES
JOB_TIMEOUT = 180  # seconds; a worker still running then is taken as hung in an all-reduce
AUTO_SHARD_LOG = re.compile(r"auto[-_ ]?shard", re.IGNORECASE)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


def rows_of(ds: Any) -> list[int]:
    return [int(v) for batch in ds for v in np.asarray(batch).ravel()]


# ---------------------------------------------------------------------------------------------
# In process: shard="auto", InputContext, arrayfeed.distribute on the default strategy.


def test_auto_shard_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_STEP_ID", "0")  # inside a job step (srun)
    ds = af.from_arrays(np.arange(10), batch_size=2, shuffle=False)
    assert rows_of(ds) == [5, 6, 7, 8, 9]
    policy = ds.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.OFF


def test_auto_shard_without_environment_reads_everything() -> None:
    ds = af.from_arrays(np.arange(5), batch_size=2, shuffle=False)
    assert rows_of(ds) == [0, 1, 2, 3, 4]


def test_auto_shard_with_a_broken_environment_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    with pytest.raises(ConfigError, match="OMPI_COMM_WORLD_SIZE"):
        af.from_arrays(np.arange(10), batch_size=2)
    # An explicit shard does not read the environment at all.
    assert len(af.from_arrays(np.arange(10), batch_size=2, shard=Shard(2, 0))) == 3


def test_input_context_shards_and_turns_auto_sharding_off() -> None:
    ctx = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4
    )
    ds = af.from_arrays(
        np.arange(9), batch_size=ctx.get_per_replica_batch_size(8), shard=ctx, shuffle=False
    )
    assert rows_of(ds) == [4, 5, 6, 7]  # 9 // 2 rows per worker: one row of shard 1 left out
    policy = ds.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.OFF


def test_shard_none_leaves_auto_sharding_to_tf_data() -> None:
    ds = af.from_arrays(np.arange(9), batch_size=4, shard=None)
    policy = ds.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.AUTO


def test_distribute_on_the_default_strategy() -> None:
    strategy = tf.distribute.get_strategy()
    ds = af.distribute(strategy, np.arange(10), global_batch_size=4, shuffle=False)
    assert [b.numpy().tolist() for b in ds] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert af.distributed_steps(ds) == 3
    assert sorted(rows_of(ds)) == list(range(10))  # a second pass is the next epoch


def test_distribute_repeat_runs_epoch_after_epoch() -> None:
    ds = af.distribute(
        tf.distribute.get_strategy(), np.arange(10), global_batch_size=5, repeat=True, seed=3
    )
    steps = af.distributed_steps(ds)
    batches = [b.numpy() for b in ds.take(3 * steps)]
    epochs = [np.concatenate(batches[i * steps : (i + 1) * steps]) for i in range(3)]
    for epoch in epochs:
        assert sorted(epoch.tolist()) == list(range(10))
    assert epochs[0].tolist() != epochs[1].tolist()  # reshuffled every epoch


class FakeStrategy:
    """Just enough of a strategy with ``replicas`` replicas in one input pipeline."""

    def __init__(self, replicas: int) -> None:
        self.num_replicas_in_sync = replicas

    def distribute_datasets_from_function(self, fn: Any) -> Any:
        return fn(tf.distribute.InputContext(1, 0, self.num_replicas_in_sync))


@pytest.mark.parametrize(
    ("replicas", "kwargs", "match"),
    [
        (4, {"global_batch_size": 30}, r"multiple of the 4 replicas.*use 28 or 32"),
        (4, {"global_batch_size": 3}, r"multiple of the 4 replicas.*use 4 or 4"),
        (1, {"global_batch_size": 0}, "`global_batch_size` must be a positive int"),
        (1, {"global_batch_size": 2.0}, "`global_batch_size` must be a positive int"),
        (
            1,
            {"global_batch_size": 8, "batch_size": 4},
            "`batch_size` is set by arrayfeed.distribute",
        ),
        (1, {"global_batch_size": 8, "shard": None}, "`shard` is set by arrayfeed.distribute"),
        # 10 rows at 2 per replica: 5 batches for 2 local replicas cannot end on a step boundary.
        (2, {"global_batch_size": 4, "repeat": True}, "5 batches per epoch for 2 local replicas"),
    ],
)
def test_distribute_rejects(replicas: int, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        af.distribute(FakeStrategy(replicas), np.arange(10), **kwargs)


def test_distribute_per_replica_batch_and_steps() -> None:
    ds = af.distribute(FakeStrategy(2), np.arange(10), global_batch_size=4, shuffle=False)
    assert [len(b) for b in ds] == [2, 2, 2, 2, 2]  # per-replica batches, two per step
    assert af.distributed_steps(ds) == 3


def test_distributed_steps_rejects_other_datasets() -> None:
    with pytest.raises(ConfigError, match=r"not made by arrayfeed\.distribute"):
        af.distributed_steps(af.from_arrays(np.arange(10), batch_size=2))


# ---------------------------------------------------------------------------------------------
# Subprocesses: real strategies.


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS and k != "TF_USE_LEGACY_KERAS"}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    env.update(extra)
    return env


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run_cluster(
    tmp_path: Path, workers: int, args: list[str], **env: str
) -> list[tuple[int, str, dict[str, Any] | None]]:
    """Run tests/mw_job.py as ``workers`` processes of one TF_CONFIG cluster on 127.0.0.1.

    Returns (exit code, stderr, JSON report or None) per worker; fails the test on a timeout.
    """
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(workers)]}
    procs = []
    for index in range(workers):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        stderr = open(tmp_path / f"stderr{index}", "w+")  # noqa: SIM115 (closed below)
        cmd = [
            sys.executable,
            str(TESTS / "mw_job.py"),
            *args,
            "--out",
            str(tmp_path / f"{index}.json"),
        ]
        procs.append(
            (
                subprocess.Popen(
                    cmd,
                    env=child_env(TF_CONFIG=tf_config, **env),
                    cwd=tmp_path,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                ),
                stderr,
            )
        )
    results = []
    try:
        for index, (proc, _) in enumerate(procs):
            try:
                proc.wait(timeout=JOB_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"worker {index} still running after {JOB_TIMEOUT} s: a hung all-reduce?"
                )
    finally:
        for proc, stderr in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            stderr.seek(0)
            out = tmp_path / f"{len(results)}.json"
            results.append(
                (
                    proc.returncode,
                    stderr.read(),
                    json.loads(out.read_text()) if out.exists() else None,
                )
            )
            stderr.close()
    return results


def check_ok(results: list[tuple[int, str, dict[str, Any] | None]]) -> list[dict[str, Any]]:
    for index, (code, stderr, report) in enumerate(results):
        assert code == 0 and report is not None, f"worker {index} failed:\n{stderr[-4000:]}"
    return [report for _, _, report in results if report is not None]


@pytest.mark.slow
def test_mirrored_strategy_fit_and_custom_loop(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(TESTS / "mirrored_job.py"), str(out)],
        env=child_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["replicas"] == 2

    fit = report["fit"]  # one worker: every row once per epoch, nothing left out
    assert fit["len_ds"] == math.ceil(1001 / 64)
    for ids in fit["ids"]:
        assert sorted(ids) == list(range(1001))
    assert fit["next_position"] == [3, 0]  # three epochs, not four: the build's look gave one back
    for ids, first in zip(fit["ids"], fit["stream_first"], strict=True):
        assert sorted(ids[:64]) == sorted(first)  # Keras epoch k trains on epoch k
    assert fit["stream_first"][0] != fit["stream_first"][1]
    assert fit["loss"][-1] < 1e-3 < fit["loss"][0]
    np.testing.assert_allclose(fit["kernel"], [1.0, -2.0, 3.0, 0.5], atol=1e-2)

    loop = report["loop"]  # per-replica batches of 32, two per step
    assert loop["distributed_steps"] == math.ceil(math.ceil(1001 / 32) / 2) == 16
    orders = []
    for epoch in loop["epochs"]:
        assert epoch["steps"] == 16
        ids = [i for step in epoch["ids"] for replica in step for i in replica]
        assert sorted(ids) == list(range(1001))
        assert all(len(replica) == 32 for step in epoch["ids"][:-1] for replica in step)
        orders.append(ids)
    assert orders[0] != orders[1]
    np.testing.assert_allclose(loop["kernel"], [1.0, -2.0, 3.0, 0.5], atol=1e-2)


def check_exactly_once(route: str, reports: list[dict[str, Any]], rows: int) -> list[int]:
    """Across workers, per epoch: equal steps, no row twice, all but the documented drop."""
    workers = len(reports)
    dropped_per_epoch = []
    for epoch in range(len(reports[0][route]["epochs"])):
        runs = [r[route]["epochs"][epoch] for r in reports]
        assert len({run["steps"] for run in runs}) == 1, f"{route}: unequal steps {runs}"
        seen: list[int] = []
        for run in runs:
            for step in run["ids"]:
                assert all(len(replica) > 0 for replica in step), f"{route}: an empty replica batch"
                seen += [i for replica in step for i in replica]
            assert sum(run["global_rows"]) == workers * (rows // workers)
        assert len(seen) == len(set(seen)), f"{route}: rows produced twice"
        missing = set(range(rows)) - set(seen)
        assert len(missing) == rows - workers * (rows // workers)  # n_rows % workers per epoch
        dropped_per_epoch.append(len(missing))
    return dropped_per_epoch


@pytest.mark.slow
def test_multi_worker_custom_loop_exactly_once_equal_steps(tmp_path: Path) -> None:
    """Two MWMS workers, 1001 rows (uneven shards of 500 and 501), two epochs per route.

    TF_CPP_MIN_LOG_LEVEL=1 here (not 2) so that tf.data's auto-shard warnings, which are C++
    warnings, would reach stderr; the control phase proves that they do.
    """
    rows, batch = 1001, 64
    results = run_cluster(
        tmp_path,
        2,
        ["--route", "loop", "--rows", str(rows), "--global-batch", str(batch), "--control"],
        TF_CPP_MIN_LOG_LEVEL="1",
    )
    reports = check_ok(results)
    assert [r["env_shard"] for r in reports] == [[2, 0], [2, 1]]

    # distribute_datasets_from_function, shard=ctx: per-replica batch = global // replicas.
    assert [r["dsff"]["per_replica_batch"] for r in reports] == [32, 32]
    assert check_exactly_once("dsff", reports, rows) == [1, 1]
    for r in reports:
        assert [e["steps"] for e in r["dsff"]["epochs"]] == [math.ceil(500 / 32)] * 2

    # experimental_distribute_dataset of from_arrays(shard="auto", batch_size=64): each worker's
    # batch of 64 is taken as the global batch, so each step takes 32 rows per worker and a
    # worker runs 2 * len(ds) steps.
    assert check_exactly_once("distribute_dataset", reports, rows) == [1, 1]
    for r in reports:
        assert r["distribute_dataset"]["len_ds"] == math.ceil(500 / batch)
        epochs = r["distribute_dataset"]["epochs"]
        assert [e["steps"] for e in epochs] == [2 * math.ceil(500 / batch)] * 2
        assert all(len(step[0]) == batch // 2 for e in epochs for step in e["ids"][:-2])

    for route in ("dsff", "distribute_dataset"):
        losses = [r[route]["epochs"][-1]["loss"] for r in reports]
        assert losses[0] == losses[1] and losses[0][-1] < 1e-2  # one model, trained

    # No auto-shard warning while arrayfeed shards; the control (shard=None) shows the check works.
    for _, stderr, _ in results:
        before, _, control = stderr.partition("=== PHASE control ===")
        assert not AUTO_SHARD_LOG.search(before), before
        assert AUTO_SHARD_LOG.search(control), control


@pytest.mark.slow
def test_keras3_fit_under_multi_worker_fails_upstream(tmp_path: Path) -> None:
    """keras-team/keras#20585: Keras 3 `fit` under MultiWorkerMirroredStrategy fails (with any
    tf.data dataset). When this test fails because fit works, update the README caveat."""
    results = run_cluster(tmp_path, 2, ["--route", "fit", "--rows", "256", "--epochs", "1"])
    for code, stderr, _ in results:
        assert code != 0
        assert "Attempt to convert a value (PerReplica" in stderr


@pytest.mark.slow
def test_tf_keras_fit_under_multi_worker(tmp_path: Path) -> None:
    """tf-keras (TF_USE_LEGACY_KERAS=1) fit on arrayfeed.distribute(repeat=True): exactly once."""
    import tf_keras  # noqa: F401  (the test extra installs it; the job imports it through TF)

    rows = 1001
    results = run_cluster(
        tmp_path,
        2,
        ["--route", "fit", "--rows", str(rows), "--epochs", "2"],
        TF_USE_LEGACY_KERAS="1",
    )
    reports = check_ok(results)
    assert all(r["keras"].startswith("2.") for r in reports)
    steps = math.ceil(500 / 32)
    for r in reports:
        assert r["steps_per_epoch"] == steps
        assert r["steps"] == [steps, steps]
    for epoch in range(2):
        per_worker = [r["ids"][epoch] for r in reports]
        assert [len(ids) for ids in per_worker] == [500, 500]
        seen = per_worker[0] + per_worker[1]
        assert len(set(seen)) == len(seen) == rows - 1
    assert reports[0]["kernel"] == reports[1]["kernel"]
    assert reports[0]["loss"][-1] < 1e-2 < reports[0]["loss"][0]


@pytest.mark.slow
def test_multi_worker_job_stopped_then_resumed_on_one_and_on_three_workers(tmp_path: Path) -> None:
    """Two MWMS workers stop after 5 steps of epoch 0 (global batch 60: 30 rows per worker);
    the job goes on from their state on one worker (60 per step) and on three (20 each)."""
    rows, stop = 1001, 5
    common = ["--route", "elastic", "--rows", str(rows), "--global-batch", "60"]
    (tmp_path / "first").mkdir()
    first = check_ok(run_cluster(tmp_path / "first", 2, [*common, "--stop-after", str(stop)]))
    states = [r["state"] for r in first]
    assert states[0] == states[1] and (states[0]["epoch"], states[0]["step"]) == (0, stop)
    taken = [i for r in first for i in r["epochs"][0]["ids"]]
    assert len(taken) == len(set(taken)) == 2 * stop * 30
    (tmp_path / "state.json").write_text(json.dumps(states[0]))
    for workers in (1, 3):
        run = tmp_path / f"on{workers}"
        run.mkdir()
        args = [*common, "--resume", str(tmp_path / "state.json")]
        reports = check_ok(run_cluster(run, workers, args))
        rest, after = zip(*(r["epochs"] for r in reports), strict=True)
        assert len({e["steps"] for e in rest}) == 1  # equal steps on every worker
        seen = taken + [i for e in rest for i in e["ids"]]
        assert len(seen) == len(set(seen))  # none twice
        # Left out: the row 2 workers leave out of 1001, and fewer than 60 of the rest.
        assert rows - 1 - len(seen) < 60
        assert all(e["epoch"] == 1 for e in after)  # then the new sharding's own epochs
        later = [i for e in after for i in e["ids"]]
        assert len(later) == len(set(later)) == workers * (rows // workers)
