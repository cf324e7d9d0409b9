"""The report's figure data, the page (escaping, embedded figures), and progress events."""

import io
import json

from fakes import FakeLauncher, FakeMachine
from zerotune import Autotuner
from zerotune.cli._progress import JsonEvents, ProgressState
from zerotune.report._figures import config_diff, memory_data, throughput_data, timeline_data
from zerotune.report._html import write_report
from zerotune.trials._trial import TrialState


def tuned(tmp_path, make_config, gpu_node, script, **kw):
    cfg = make_config(
        {"fast": False, "tuner_early_stopping": 3}, zero_optimization={"stage": "all", "overlap_comm": [True, False]}
    )
    events = []
    tuner = Autotuner(
        [str(script), "--deepspeed_config", str(cfg), "--tag", "<script>alert(1)</script>"],
        num_gpus=2,
        memory_per_device="5GiB",
        launcher=FakeLauncher(FakeMachine()),
        node=gpu_node,
        results_dir=tmp_path / "results",
        on_event=events.append,
        **kw,
    )
    return tuner, tuner.tune(), events


def test_figure_data_follows_the_trials(tmp_path, make_config, gpu_node, script):
    tuner, result, _ = tuned(tmp_path, make_config, gpu_node, script)
    series = throughput_data(result.trials, "throughput")
    ok = [t for t in result.trials if t.state is TrialState.OK]
    assert sum(len(v) for v in series.values()) == len(ok)
    assert all(label.startswith("z") and "_mb" not in label for label in series)
    for rows in series.values():
        assert [r[0] for r in rows] == sorted(r[0] for r in rows) and all(r[2] >= 0 for r in rows)
    mem = memory_data(result.trials, dp=2)
    assert len(mem) == len(ok)
    # The fake machine's peaks are linear in the micro-batch: left-out predictions are exact.
    exact = [p for p in mem if p.predicted is not None]
    assert exact and all(abs(p.predicted - p.measured) / p.measured < 0.01 for p in exact)
    spans = timeline_data(result.trials, tmp_path / "results")
    assert len(spans) == len(result.trials) and spans[0].start == 0
    assert {s.state for s in spans} >= {"ok"} and all(s.end >= s.start for s in spans)


def test_config_diff_names_each_change():
    user = {
        "zero_optimization": {"stage": "all", "overlap_comm": [True, False]},
        "autotuning": {"x": 1},
        "optimizer": {"type": "AdamW"},
    }
    chosen = {
        "zero_optimization": {"stage": 2, "overlap_comm": False},
        "optimizer": {"type": "AdamW"},
        "train_micro_batch_size_per_gpu": 8,
    }
    assert config_diff(user, chosen) == [
        ("train_micro_batch_size_per_gpu", None, 8),
        ("zero_optimization.overlap_comm", [True, False], False),
        ("zero_optimization.stage", "all", 2),
    ]


def test_report_page_embeds_its_figures_and_escapes_user_strings(tmp_path, make_config, gpu_node, script):
    tuner, result, _ = tuned(tmp_path, make_config, gpu_node, script)
    page = write_report(tmp_path / "results")
    text = page.read_text()
    for name in ("throughput", "memory", "timeline"):
        assert (tmp_path / "results" / "report" / f"{name}.png").stat().st_size > 1000
        assert f'id="{name}" ' in text and "data:image/png;base64," in text
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert result.best.name in text and "zero_optimization.stage" in text
    assert "http" not in text.replace("http-equiv", "")  # self-contained: loads nothing


def test_json_events_one_object_per_line(tmp_path, make_config, gpu_node, script):
    stream = io.StringIO()
    sink = JsonEvents(stream)
    tuner, result, events = tuned(tmp_path, make_config, gpu_node, script)
    for e in events:
        sink(e)
    sink.result(result)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    kinds = [line["event"] for line in lines]
    assert kinds[-1] == "result" and lines[-1]["best"] == result.best.name
    assert "started" in kinds and "finished" in kinds and "best" in kinds
    finished = [line for line in lines if line["event"] == "finished"]
    assert all("state" in line and "counts" in line for line in finished)
    assert any("value" in line and "ci95" in line for line in finished)


def test_progress_state_counts_and_time_left(tmp_path, make_config, gpu_node, script):
    tuner, result, events = tuned(tmp_path, make_config, gpu_node, script)
    state = ProgressState("throughput", slots=1)
    for e in events:
        state.update(e)
    assert sum(state.counts.values()) == len(result.trials)
    assert state.counts["ok"] == sum(t.state is TrialState.OK for t in result.trials)
    assert state.best is not None and state.best.name == result.best.name
    line = state.status()
    assert "trial" in line and "best " + result.best.name in line and "left" in line


def test_printed_reasons_and_notes_are_never_markup(capsys):
    """A reason that quotes a path in brackets ("[/__w/pytorch/...]") once crashed the printer."""
    from rich.console import Console

    from zerotune.cli._progress import ProgressPrinter
    from zerotune.trials._trial import TrialResult, TrialSpec
    from zerotune.tuning._tuner import TuningEvent

    console = Console(file=io.StringIO(), width=200)
    printer = ProgressPrinter(console=console)
    bad = "RuntimeError: [/__w/pytorch/third_party/gloo/pair.cc:537] Read error [bold]"
    result = TrialResult(spec=TrialSpec(stage=1, micro_batch=2), state=TrialState.CRASHED, reason=bad)
    printer(TuningEvent("finished", 0, 5, result.spec, result))
    printer(TuningEvent("note", message=bad))
    assert console.file.getvalue().count("[/__w/pytorch/third_party/gloo/pair.cc:537]") == 2


def many_trials_folder(root, n=2000):
    """A results folder of ``n`` measured trials over 3 stages and many knob values."""
    from zerotune.results._record import Identity, TuningRecord
    from zerotune.trials._trial import Measurement, TrialResult, TrialSpec, TrialState

    ident = Identity(code="c", args=[], topology={}, measure={}, env={}, failure={})
    record = TuningRecord(root, identity=ident, session={"metric": "throughput", "num_gpus": 2, "budget": 8 * 1024**3})
    for i in range(n):
        spec = TrialSpec(
            stage=i % 3 + 1,
            micro_batch=2 ** (i % 5),
            overrides=(("zero_optimization.reduce_bucket_size", float(1e6 + i // 15)),),
        )
        step = 0.1 + (i % 7) / 100
        result = TrialResult(
            spec=spec,
            state=TrialState.OK if i % 9 else TrialState.OOM,
            peak_memory=[10**9 + i] * 2,
            static_memory=[5 * 10**8] * 2,
            wall_time=1.0,
            measurement=Measurement(
                samples_per_step=8,
                step_time_mean=step,
                step_time_std=0.01,
                step_time_ci95=0.005,
                steps_measured=10,
                stable=True,
            ),
        )
        record.save(result, {"i": i})
        record.trials.append(result)
    record.write_session("finished")
    return root


def test_a_report_of_thousands_of_trials_has_bounded_figures(tmp_path):
    import struct

    root = many_trials_folder(tmp_path / "results")
    write_report(root)
    for png in ("throughput", "memory", "timeline"):
        width, height = struct.unpack(">II", (root / "report" / f"{png}.png").read_bytes()[16:24])
        assert width <= 1200 and height <= 2400, (png, width, height)


def test_report_says_how_each_trial_started(tmp_path, make_config, gpu_node, script):
    class StartingLauncher(FakeLauncher):
        def run(self, job):
            r = super().run(job)
            r.start = "warm (trial 2 of its processes)" if self.jobs[1:] else "cold (new warm processes)"
            r.retired = "<b>leak</b>" if len(self.jobs) == 2 else ""
            return r

    cfg = make_config(None, zero_optimization={"stage": [1, 2]}, train_micro_batch_size_per_gpu=8)
    Autotuner(
        [str(script), "--deepspeed_config", str(cfg)],
        num_gpus=2,
        memory_per_device="8GiB",
        launcher=StartingLauncher(FakeMachine(speed={1: 1.5, 2: 1.0})),
        node=gpu_node,
        results_dir=tmp_path / "results",
    ).tune()
    text = write_report(tmp_path / "results").read_text()
    assert "<th>processes</th>" in text and "warm (trial 2 of its processes); then retired: &lt;b&gt;leak" in text
