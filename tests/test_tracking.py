"""Experiment tracking from tuning events: MLflow against a local store, TensorBoard scalars."""

import pytest

from fakes import FakeLauncher, FakeMachine
from zerotune import Autotuner
from zerotune.cli._tracking import MlflowTracker, TensorBoardTracker, mlflow_wanted
from zerotune.trials._trial import TrialState


def tune_with(tmp_path, make_config, gpu_node, script, tracker):
    tuner = Autotuner(
        [str(script), "--deepspeed_config", str(make_config())],
        num_gpus=2,
        memory_per_device="5GiB",
        launcher=FakeLauncher(FakeMachine()),
        node=gpu_node,
        results_dir=tmp_path / "results",
        on_event=tracker,
    )
    tracker.start(tuner)
    result = tuner.tune()
    tracker.end(result)
    return result


@pytest.mark.parametrize("store", ["file", "sqlite"])
def test_mlflow_parent_run_with_a_nested_run_per_trial(tmp_path, make_config, gpu_node, script, monkeypatch, store):
    pytest.importorskip("mlflow")
    if store == "file":  # MLflow 3 keeps its file store only on request
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        uri = (tmp_path / "mlruns").as_uri()
    else:
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # a SQL store keeps artifacts in ./mlruns: not in the repository
    import mlflow

    mlflow.set_tracking_uri(uri)
    assert mlflow_wanted()
    result = tune_with(tmp_path, make_config, gpu_node, script, MlflowTracker())
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.search_experiments()[0].experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].data.tags["best_trial"] == result.best.name
    assert len(children) == len(result.trials)
    assert {c.data.tags["mlflow.runName"] for c in children} == {t.name for t in result.trials}
    ok = [c for c in children if c.data.tags["state"] == "ok"]
    assert ok and all("throughput" in c.data.metrics and "peak_memory_bytes" in c.data.metrics for c in ok)
    assert all({"stage", "micro_batch", "grad_accum"} <= set(c.data.params) for c in children)
    assert "best_throughput" in parents[0].data.metrics


def test_mlflow_is_off_without_a_tracking_uri(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert not mlflow_wanted()


def test_tensorboard_scalars_per_trial(tmp_path, make_config, gpu_node, script):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = tune_with(tmp_path, make_config, gpu_node, script, TensorBoardTracker(tmp_path / "tb"))
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"trial/throughput", "best/throughput", "trial/peak_memory_gib"} <= set(tags)
    ok = [t for t in result.trials if t.state is TrialState.OK]
    assert len(acc.Scalars("trial/throughput")) == len(ok)
    best = acc.Scalars("best/throughput")
    assert [e.value for e in best] == sorted(e.value for e in best)  # never falls
    assert best[-1].value == pytest.approx(max(t.metric("throughput") for t in ok), rel=1e-4)
