"""The Autotuner: ask the searcher, launch, observe, store. The CLI and Lightning call this."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import hardware
from ._errors import ConfigError, NoFeasibleConfigError
from .command import UserCommand
from .config import TuningRequest, load_ds_config, parse_request
from .launch import Launcher, LocalLauncher, TrialJob
from .lightning_job import LightningJob, inspect_script, lightning_form, looks_like_lightning
from .memory import MemoryModel
from .memory_terms import MemorySetup
from .ranking import choose_best
from .result import TuningResult
from .search import EarlyStopping, MicroBatchSearch, Searcher
from .space import invalid_reason, trial_config
from .store import SESSION, ResultStore, fingerprint, write_json
from .trial import TrialResult, TrialSpec, TrialState
from .units import parse_duration, parse_size


@dataclass(frozen=True)
class TuningEvent:
    """Progress for the caller: kind is one of started, finished, reused, pruned, best, note."""

    kind: str
    index: int = 0
    max_trials: int = 0
    spec: TrialSpec | None = None
    result: TrialResult | None = None
    message: str = ""


class Autotuner:
    """Finds the fastest DeepSpeed configuration of a training command on this node.

    ``command`` is the user's script and its arguments, or a function ``train(ds_config: dict)``
    defined at the top level of a .py file (each trial runs it in fresh processes, which call
    ``deepspeed.initialize(config=ds_config)``). ``ds_config`` is a dict or a path (default: the
    ``--deepspeed_config``/``--deepspeed`` value in the command). ``memory_per_device`` is a
    budget in bytes or a size such as "16GB" (default: device memory on GPU, RAM / processes on
    CPU). ``budget`` is wall-clock time: no trial starts after that many seconds (or "20m").
    ``on_event`` receives a :class:`TuningEvent` for each step of progress; the core never prints.
    """

    def __init__(self, command: list[str] | Callable[[dict[str, Any]], Any],
                 ds_config: str | Path | dict[str, Any] | None = None, *,
                 num_gpus: int | None = None, num_nodes: int = 1, memory_per_device: int | str | None = None,
                 results_dir: str | Path | None = None, searcher: Searcher | None = None,
                 budget: float | str | None = None, launcher: Launcher | None = None,
                 on_event: Callable[[TuningEvent], None] | None = None, trial_timeout: float = 600.0,
                 precision: float = 0.03, max_measure_seconds: float = 15.0, overwrite: bool | None = None,
                 node: hardware.Node | None = None, lightning: LightningJob | None = None,
                 offload: bool | None = None):
        self.command = UserCommand.from_callable(command) if callable(command) else UserCommand.parse(command)
        if num_nodes != 1:
            raise ConfigError("--num-nodes above 1 is not supported yet; tune on one node")
        self.node = node or hardware.detect()
        source = ds_config if ds_config is not None else self.command.config_path()
        if source is None and lightning is None and looks_like_lightning(self.command.script):
            lightning = self._inspect(Path(results_dir or "autotuning_results") / "_inspect")
        self.lightning = lightning
        if lightning is not None:
            num_gpus = self._lightning_processes(lightning, num_gpus)
            source = lightning.tuning_config() if source is None else source
        if source is None:
            raise ConfigError("no ds_config given; add --deepspeed_config ds.json to the script's arguments")
        self.user_config = load_ds_config(source)
        self.num_gpus = num_gpus or (self.node.device_count if self.node.device == "cuda" else 1)
        if num_gpus is not None and num_gpus < 1:
            raise ConfigError(f"--num-gpus must be at least 1, not {num_gpus}")
        if self.node.device == "cuda" and self.num_gpus > self.node.device_count:
            raise ConfigError(f"--num-gpus {self.num_gpus} is more than the {self.node.device_count} GPUs here")
        self.request: TuningRequest = parse_request(self.user_config, world_size=self.num_gpus)
        at = self.request.autotuning
        self.dp = self.num_gpus // at.mp_size
        self.budget = self._budget(memory_per_device)
        self.results_dir = Path(results_dir or at.results_dir)
        self.overwrite = at.overwrite if overwrite is None else overwrite
        self.time_budget = parse_duration(budget, what="budget (--time-budget)") if budget else None
        self.launcher = launcher or LocalLauncher(device=self.node.device)
        self.on_event = on_event or (lambda e: None)
        self.trial_timeout, self.precision, self.max_measure_seconds = trial_timeout, precision, max_measure_seconds
        self.mixed_precision = any((self.user_config.get(k) or {}).get("enabled") for k in ("fp16", "bf16"))
        self.offload = offload
        self.custom_searcher = searcher is not None
        self.searcher = searcher or self._default_searcher()
        self.result: TuningResult | None = None
        self.notes: list[str] = []

    # -- set-up --------------------------------------------------------------------------------
    def _inspect(self, out_dir: Path) -> LightningJob:
        from .launch import trial_env

        return inspect_script(self.command.script, list(self.command.args), out_dir,
                              trial_env(1, self.node.device))

    @staticmethod
    def _lightning_processes(job: LightningJob, num_gpus: int | None) -> int:
        if job.num_nodes != 1:
            raise ConfigError(f"the Trainer asks for num_nodes={job.num_nodes}; zerotune tunes on one node: tune "
                              "with num_nodes=1, then train on more nodes with the config it writes")
        if num_gpus is not None and num_gpus != job.world_size:
            raise ConfigError(f"--num-gpus {num_gpus} does not match the Trainer's devices={job.world_size}; "
                              f"pass --num-gpus {job.world_size} (or leave it out) or change the Trainer")
        return job.world_size

    def _budget(self, memory_per_device: int | str | None) -> int:
        if memory_per_device is not None:
            return parse_size(memory_per_device, what="--memory-per-device")
        if self.node.device == "cuda" and self.node.device_memory:
            return self.node.device_memory
        return self.node.host_memory // self.num_gpus

    def candidates(self) -> list[int]:
        at, req = self.request.autotuning, self.request
        lo, hi = at.min_train_micro_batch_size_per_gpu, at.max_train_micro_batch_size_per_gpu
        if req.micro_batches is not None:
            return req.micro_batches
        if req.global_batch is None:
            return list(range(lo, hi + 1))
        per_rank = req.global_batch // self.dp
        out = [m for m in range(lo, min(hi, per_rank) + 1) if per_rank % m == 0]
        if not out:
            raise ConfigError(f"no micro-batch between {lo} and {hi} divides the {per_rank} samples per process of "
                              f"the global batch {req.global_batch}; widen the micro-batch bounds or change "
                              "max_train_batch_size")
        return out

    def _default_searcher(self) -> Searcher:
        at = self.request.autotuning
        gas = self.user_config.get("gradient_accumulation_steps")
        return MicroBatchSearch(
            stages=self.request.stages, candidates=self.candidates(), global_batch=self.request.global_batch,
            dp=self.dp, grad_accum=gas if isinstance(gas, int) and gas >= 1 else 1, budget=self.budget,
            metric=at.metric, num_micro_batches=at.num_tuning_micro_batch_sizes,
            memory=self._memory_model(), prune={s: r for s in self.request.stages
                                                if (r := invalid_reason(s, self.request.base_config))})

    @property
    def mp(self) -> int:
        return self.request.autotuning.mp_size

    def _memory_model(self, overrides: dict[int, tuple] | None = None) -> MemoryModel:
        """The memory model for this config: its precision, ZeRO buckets and offload per stage
        (``overrides``: per stage, what every trial of that stage sets, offload for example)."""

        def setup_for(stage: int, num_params: int) -> MemorySetup:
            spec = TrialSpec(stage=stage, micro_batch=1, overrides=(overrides or {}).get(stage, ()))
            return MemorySetup.from_config(trial_config(self.request.base_config, spec, self.dp),
                                           num_params=num_params, dp=self.dp, mp=self.mp)

        info = self.request.autotuning.model_info
        known = (info.num_params if info else None) or (self.lightning.num_params if self.lightning else None)
        return MemoryModel(dp=self.dp, mixed_precision=self.mixed_precision, setup_for=setup_for, num_params=known)

    # -- the loop ------------------------------------------------------------------------------
    def tune(self) -> TuningResult:
        """Run the search; finished trials on disk are reused, so a rerun resumes."""
        at = self.request.autotuning
        store = ResultStore(self.results_dir, overwrite=self.overwrite)
        self.overwrite = False  # a second tune() on this object resumes
        start = time.monotonic()
        trials: list[TrialResult] = []
        self._launched = 0
        self._best_name = None
        self._write_session(store, "running", [], 0.0)
        try:
            for searcher, stopper in self._phases(trials):
                if not self._run_phase(store, searcher, stopper, trials, start):
                    break
        except BaseException:
            self.launcher.close()
            self._write_session(store, "interrupted", trials, time.monotonic() - start)
            raise
        wall = time.monotonic() - start
        choice = choose_best(trials, at.metric)
        notes = self.notes + list(getattr(self.searcher, "notes", [])) + ([choice.note] if choice and choice.note
                                                                           else [])
        best_config = trial_config(self.request.base_config, choice.best.spec, self.dp,
                                   script_sets_batch=bool(self._mapped(choice.best.spec))) if choice else None
        if best_config is not None and self.lightning is not None:
            best_config = lightning_form(best_config)
        self.result = TuningResult(metric=at.metric, trials=trials, best=choice.best if choice else None,
                                   best_config=best_config, results_dir=self.results_dir, notes=notes,
                                   wall_time=wall, launched=self._launched)
        self._write_session(store, "finished", trials, wall, notes)
        from .report import write_outputs

        write_outputs(self)
        if choice is None:
            raise NoFeasibleConfigError(
                "no configuration ran successfully: " + "; ".join(f"{t.name}: {t.state.value} ({t.reason})"
                                                               for t in trials[-3:])
                + f". Trial logs are in {self.results_dir}; lower min_train_micro_batch_size_per_gpu, raise "
                  "--memory-per-device, or fix the error shown")
        return self.result

    def _phases(self, trials: list[TrialResult]):
        """(searcher, stopping rule) in turn; each is built when the one before has finished."""
        from . import phases

        yield self.searcher, None
        if self.custom_searcher:
            return
        if (offload := phases.offload_searcher(self, trials)) is not None:
            yield offload, None
        yield from phases.knob_searchers(self, trials)

    def _run_phase(self, store: ResultStore, searcher: Searcher, stopper: EarlyStopping | None,
                   trials: list[TrialResult], start: float) -> bool:
        """Runs one searcher to its end; False when a limit (trials, time) stopped the tuning."""
        metric = self.request.autotuning.metric
        while (suggestion := searcher.suggest()) is not None:
            result = self._trial(store, suggestion, trials, start)
            if result is None:
                return False
            trials.append(result)
            searcher.observe(result)
            choice = choose_best(trials, metric)
            if choice and choice.best.name != self._best_name:
                self._best_name = choice.best.name
                self._emit("best", len(trials), choice.best.spec, choice.best)
            if stopper is not None and stopper.observe(result):
                self._note(stopper.reason)
                break
        if searcher is not self.searcher:
            self.notes += list(getattr(searcher, "notes", []))
        return True

    def _trial(self, store: ResultStore, suggestion, trials: list[TrialResult], start: float) -> TrialResult | None:
        """The result of one suggestion: pruned, reused from disk, or run now. None: a limit
        (tuner_num_trials, time budget) stops the search before this trial."""
        at, spec, index = self.request.autotuning, suggestion.spec, len(trials)
        if suggestion.prune_reason:
            result = TrialResult(spec=spec, state=TrialState.PRUNED, reason=suggestion.prune_reason,
                                 budget=self.budget)
            store.save(result, "pruned")
            self._emit("pruned", index, spec, result, suggestion.prune_reason)
            return result
        cfg = trial_config(self.request.base_config, spec, self.dp, script_sets_batch=bool(self._mapped(spec)))
        key = self._key(cfg)
        if (result := store.load(spec.name, key)) is not None:
            self._emit("reused", index, spec, result)
            return result
        if self._launched >= at.tuner_num_trials:
            self._note(f"stopped after tuner_num_trials={at.tuner_num_trials} trials")
            return None
        if self.time_budget and time.monotonic() - start > self.time_budget:
            self._note(f"stopped at the time budget of {self.time_budget:.0f} s")
            return None
        self._emit("started", index, spec)
        job = self._job(store, spec, cfg)
        best = choose_best(trials, at.metric)
        if best is not None and at.metric in ("throughput", "latency"):
            job.to_beat = {"metric": at.metric, "value": best.best.metric(at.metric)}
        result = self.launcher.run(job)
        self._launched += 1
        store.save(result, key)
        self._emit("finished", index, spec, result)
        return result

    def _job(self, store: ResultStore, spec: TrialSpec, cfg: dict[str, Any]) -> TrialJob:
        d = store.trial_dir(spec.name)
        write_json(d / "ds_config.json", cfg)
        config_arg = None if self.lightning else str((d / "ds_config.json").resolve())
        args = self.command.trial_args(config_arg, self._mapped(spec))
        at = self.request.autotuning
        job = TrialJob(spec=spec, trial_dir=d, script=self.command.script, script_args=args,
                       lightning=self.lightning is not None,
                       local_rank_arg=self.command.takes_local_rank(), num_gpus=self.num_gpus, budget=self.budget,
                       warmup_steps=max(1, at.start_profile_step - 1),  # timed from step start_profile_step on
                       min_steps=max(3, at.end_profile_step - at.start_profile_step),
                       max_seconds=self.max_measure_seconds, rel_ci=self.precision, timeout=self.trial_timeout)
        exp = {"name": spec.name, **spec.to_dict(), "ds_config": cfg}
        write_json(d / "exp.json", exp)
        if "exps_dir" in at.model_fields_set:  # DeepSpeed's layout, when the user asked for it
            Path(at.exps_dir).mkdir(parents=True, exist_ok=True)
            write_json(Path(at.exps_dir) / f"{spec.name}.json", exp)
        return job

    def _mapped(self, spec: TrialSpec) -> dict[str, str]:
        values = {"train_micro_batch_size_per_gpu": spec.micro_batch, "gradient_accumulation_steps": spec.grad_accum}
        return {arg: str(values[key]) for key, arg in (self.request.autotuning.arg_mappings or {}).items()
                if key in values}

    def _key(self, cfg: dict[str, Any]) -> str:
        return fingerprint({"config": cfg, "script": str(Path(self.command.script).resolve()),
                            "args": list(self.command.args), "num_gpus": self.num_gpus, "budget": self.budget,
                            "precision": self.precision})

    def _emit(self, kind: str, index: int = 0, spec=None, result=None, message: str = "") -> None:
        self.on_event(TuningEvent(kind, index, self.request.autotuning.tuner_num_trials, spec, result, message))

    def _note(self, message: str) -> None:
        self.notes.append(message)
        self._emit("note", message=message)

    def _write_session(self, store: ResultStore, state: str, trials, wall: float, notes=()) -> None:
        write_json(store.root / SESSION, {
            "state": state, "metric": self.request.autotuning.metric, "script": self.command.script,
            "args": list(self.command.args), "num_gpus": self.num_gpus, "device": self.node.device,
            "budget": self.budget, "wall_time": wall, "trials": [t.name for t in trials], "notes": list(notes)})

    # -- after tuning --------------------------------------------------------------------------
    def write_optimal_config(self, path: str | Path) -> Path:
        from .report import write_optimal_config

        assert self.result is not None and self.result.best_config is not None, "call tune() first"
        return write_optimal_config(self.result.best_config, Path(path))

    def run_after_tuning(self, extra_env: dict[str, str] | None = None) -> int:
        """Train with the best config, output streamed to this terminal; returns the exit status."""
        from .report import run_training

        result = self.result or self.tune()
        assert result.best_config is not None
        return run_training(self, self.results_dir / "ds_config_optimal.json", extra_env)
