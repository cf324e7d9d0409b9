"""The Autotuner: ask the searcher, launch, observe, store. The CLI and Lightning call this."""
from __future__ import annotations

import copy
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
from .search import MicroBatchSearch, Searcher
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


def trial_config(base: dict[str, Any], spec: TrialSpec, dp: int) -> dict[str, Any]:
    """The user's config with the trial's stage, micro-batch and accumulation filled in."""
    cfg = copy.deepcopy(base)
    zero = dict(cfg.get("zero_optimization") or {})
    zero["stage"] = spec.stage
    cfg["zero_optimization"] = zero
    cfg["train_micro_batch_size_per_gpu"] = spec.micro_batch
    cfg["gradient_accumulation_steps"] = spec.grad_accum
    cfg["train_batch_size"] = spec.micro_batch * spec.grad_accum * dp
    for key, value in spec.overrides:
        node = cfg
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return cfg


def invalid_stages(base: dict[str, Any], stages: list[int]) -> dict[int, str]:
    """Stages the user's own offload settings rule out, with the reason."""
    zero = base.get("zero_optimization") or {}
    out: dict[int, str] = {}

    def offloads(key: str) -> bool:
        block = zero.get(key)
        return isinstance(block, dict) and block.get("device", "none") not in ("none", None)

    for stage in stages:
        if offloads("offload_param") and stage < 3:
            out[stage] = "offload_param needs ZeRO stage 3"
        elif offloads("offload_optimizer") and stage < 1:
            out[stage] = "offload_optimizer needs ZeRO stage 1 or higher"
    return out


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
        self.searcher = searcher or self._default_searcher()
        self.result: TuningResult | None = None
        self.notes: list[str] = []
        if not at.fast:
            self.notes.append("fast: false: this version tunes the ZeRO stage and micro-batch only "
                              "(ZeRO bucket and prefetch knobs are not searched yet)")
        if at.tuner_type != "gridsearch":
            self.notes.append(f"tuner_type {at.tuner_type}: the stage and micro-batch search is the same for "
                              "every tuner_type in this version")

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
            memory=self._memory_model(), prune=invalid_stages(self.request.base_config, self.request.stages))

    def _memory_model(self, overrides: dict[int, tuple] | None = None) -> MemoryModel:
        """The memory model for this config: its precision, ZeRO buckets and offload per stage."""
        cfg = self.request.base_config
        zero = cfg.get("zero_optimization") or {}
        precision = next((k for k in ("bf16", "fp16") if (cfg.get(k) or {}).get("enabled")), "fp32")

        def number(key: str, default: float) -> float:
            value = zero.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

        def device(block: str, stage: int) -> str:
            forced = dict((overrides or {}).get(stage, ()))
            value = forced.get(f"zero_optimization.{block}.device") or (zero.get(block) or {}).get("device", "none")
            return value if value in ("cpu", "nvme") else "none"

        def setup_for(stage: int, num_params: int) -> MemorySetup:
            return MemorySetup(
                num_params=num_params, dp=self.dp, mp=self.request.autotuning.mp_size, precision=precision,
                stage=stage, offload_optimizer=device("offload_optimizer", stage) if stage >= 1 else "none",
                offload_param=device("offload_param", stage) if stage == 3 else "none",
                reduce_bucket_size=number("reduce_bucket_size", 5e8),
                allgather_bucket_size=number("allgather_bucket_size", 5e8),
                overlap_comm=bool(zero.get("overlap_comm", stage == 3)),
                prefetch_bucket_size=number("stage3_prefetch_bucket_size", 5e7))

        info = self.request.autotuning.model_info
        known = (info.num_params if info else None) or (self.lightning.num_params if self.lightning else None)
        return MemoryModel(dp=self.dp, mixed_precision=self.mixed_precision, setup_for=setup_for, num_params=known)

    def _offload_searcher(self, trials: list[TrialResult]) -> Searcher | None:
        """Offload to CPU where needed (``offload`` None: only when nothing fit without it), or
        always (True): the optimizer for stages 1-2, optimizer and parameters for stage 3."""
        zero = self.request.base_config.get("zero_optimization") or {}
        if self.offload is False or zero.get("offload_optimizer") or zero.get("offload_param"):
            return None
        if self.offload is None and (any(t.state is TrialState.OK for t in trials)
                                     or not any(t.state is TrialState.OOM for t in trials)):
            return None
        stages = [s for s in self.request.stages if s >= 1]
        if not stages:
            return None
        common: tuple = (("zero_optimization.offload_optimizer.device", "cpu"),)
        if "optimizer" not in self.request.base_config:  # a client optimizer: let DeepSpeed offload it
            common += (("zero_force_ds_cpu_optimizer", False),)
        overrides = {s: common + ((("zero_optimization.offload_param.device", "cpu"),) if s == 3 else ())
                     for s in stages}
        self._note(("nothing fit without offload: " if self.offload is None else "")
                   + f"searching stages {stages} with offload to cpu")
        at = self.request.autotuning
        return MicroBatchSearch(
            stages=stages, candidates=self.candidates(), global_batch=self.request.global_batch, dp=self.dp,
            grad_accum=1, budget=self.budget, metric=at.metric, num_micro_batches=at.num_tuning_micro_batch_sizes,
            memory=self._memory_model(overrides), overrides=overrides)

    # -- the loop ------------------------------------------------------------------------------
    def tune(self) -> TuningResult:
        """Run the search; finished trials on disk are reused, so a rerun resumes."""
        at = self.request.autotuning
        store = ResultStore(self.results_dir, overwrite=self.overwrite)
        self.overwrite = False  # a second tune() on this object resumes
        start = time.monotonic()
        trials: list[TrialResult] = []
        self._launched = 0
        best_name = None
        self._write_session(store, "running", [], 0.0)
        searcher: Searcher | None = self.searcher
        stopped = False
        try:
            while searcher is not None and not stopped:
                while (suggestion := searcher.suggest()) is not None:
                    result = self._trial(store, suggestion, trials, start)
                    if result is None:
                        stopped = True
                        break
                    trials.append(result)
                    searcher.observe(result)
                    choice = choose_best(trials, at.metric)
                    if choice and choice.best.name != best_name:
                        best_name = choice.best.name
                        self._emit("best", len(trials), choice.best.spec, choice.best)
                self.notes += [n for n in getattr(searcher, "notes", []) if searcher is not self.searcher]
                searcher = self._offload_searcher(trials) if searcher is self.searcher else None
        except BaseException:
            self.launcher.close()
            self._write_session(store, "interrupted", trials, time.monotonic() - start)
            raise
        wall = time.monotonic() - start
        choice = choose_best(trials, at.metric)
        notes = self.notes + list(getattr(self.searcher, "notes", [])) + ([choice.note] if choice and choice.note
                                                                           else [])
        best_config = trial_config(self.request.base_config, choice.best.spec, self.dp) if choice else None
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
        cfg = trial_config(self.request.base_config, spec, self.dp)
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
