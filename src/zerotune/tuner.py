"""The Autotuner: ask the searcher, launch, observe, store. The CLI and Lightning call this."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import hardware
from ._errors import ConfigError, NoFeasibleConfigError, ZerotuneError
from .accelerate_job import AccelerateLaunch, is_accelerate_launch
from .api_check import checked
from .cluster import Cluster, check_counts
from .confirm import confirm, earlier_confirmation
from .command import UserCommand
from .config import TuningRequest, load_ds_config, parse_request
from .cost import tuning_cost
from .launch import Launcher, TrialJob, end_leftovers, leftovers_line, trial_env
from .loop import PhaseRun
from .memory import MemoryModel
from .memory_terms import MemorySetup
from .ranking import choose_best
from .record import Identity, TuningEvent, TuningRecord
from .result import TuningResult, no_choice_message
from .results_folder import FolderLock, claim, discard, expand, make_folder
from .search import MicroBatchSearch, Searcher
from .settings import MeasureSettings
from .space import invalid_reason, trial_config
from .store import write_json
from .targets import Target, detect, require_config
from .trial import TrialSpec
from .units import parse_duration, parse_size

__all__ = ["Autotuner", "TuningEvent"]


class Autotuner:
    """Finds the fastest DeepSpeed configuration of a training command on this node.

    ``command`` is the user's script and its arguments, or a function ``train(ds_config: dict)``
    defined at the top level of a .py file (each trial runs it in fresh processes, which call
    ``deepspeed.initialize(config=ds_config)``). ``ds_config`` is a dict or a path (default: the
    ``--deepspeed_config``/``--deepspeed`` value in the command). ``memory_per_device`` is a
    budget in bytes or a size such as "16GB" (default: device memory on GPU, RAM / processes on
    CPU). ``budget`` is wall-clock time: no trial starts after that many seconds (or "20m").
    ``trial_timeout`` ends a trial after that many seconds in all; ``stall_timeout`` ends one whose
    training stopped making progress (no step on any rank) for that long. Trials run
    ``devices // num_gpus`` at a time on disjoint GPUs (one at a time on CPU), at most
    ``max_concurrent_trials``. ``warm_trials`` False starts every trial in processes of its own
    (default: the autotuning section's ``warm_trials``, true: trials on one node reuse their
    processes, see zerotune.launch._warm). ``retry_failed`` runs again the stored trials that failed (else
    they are retried only when the timeouts or memory budget that failed them changed).
    ``lightning`` (a :class:`~zerotune.lightning_job.LightningJob`) makes the target a Lightning
    program; a script without a ds_config that imports Lightning is found to be one by itself.
    ``on_event`` receives a :class:`TuningEvent` for each step of progress; the core never prints.
    """

    @checked
    def __init__(self, command: list[str] | Callable[[dict[str, Any]], Any],
                 ds_config: str | Path | dict[str, Any] | None = None, *,
                 num_gpus: int | None = None, num_nodes: int | None = None,
                 memory_per_device: int | str | None = None,
                 results_dir: str | Path | None = None, searcher: Searcher | None = None,
                 budget: float | str | None = None, launcher: Launcher | None = None,
                 on_event: Callable[[TuningEvent], None] | None = None, trial_timeout: float | None = None,
                 precision: float | None = None, max_measure_seconds: float | None = None,
                 overwrite: bool | None = None, node: hardware.Node | None = None,
                 lightning: Any = None, offload: bool | None = None,
                 stall_timeout: float | None = None,
                 max_concurrent_trials: int | None = None, hostfile: str | Path | None = None, include: str = "",
                 exclude: str = "", multinode_launcher: str = "pdsh", master_addr: str | None = None,
                 retry_failed: bool = False, warm_trials: bool | None = None):
        accelerate = None
        if not callable(command) and is_accelerate_launch(command):
            accelerate = AccelerateLaunch.split(command)  # `accelerate launch [options] script.py ...`
            command = list(accelerate.script_command)
        self.command = UserCommand.from_callable(command) if callable(command) else UserCommand.parse(command)
        self.node = node or hardware.detect()
        self.measure = MeasureSettings.of(precision=precision, max_seconds=max_measure_seconds,
                                          trial_timeout=trial_timeout, stall_timeout=stall_timeout)
        cluster_args = dict(device=self.node.device, device_count=self.node.device_count, num_nodes=num_nodes,
                            hostfile=hostfile, include=include, exclude=exclude, launcher=multinode_launcher,
                            master_addr=master_addr)
        check_counts(num_gpus, num_nodes)  # before anything runs the script
        self.target: Target = detect(self.command, ds_config, lightning,
                                     inspect_dir=expand(results_dir or "autotuning_results") / "_inspect",
                                     env=trial_env(1, self.node.device), accelerate=accelerate)
        num_gpus = self.target.processes(num_gpus)
        self.user_config = load_ds_config(require_config(self.target.config_source(ds_config)))
        self.cluster = Cluster.build(num_gpus=num_gpus, **cluster_args)
        self.target.check_cluster(self.cluster)
        self.num_gpus, self.num_nodes, self.world = self.cluster.num_gpus, self.cluster.num_nodes, self.cluster.world
        self.request: TuningRequest = parse_request(self.user_config, world_size=self.world)
        self.arg_mappings = self.target.arg_mappings(self.request.space_config, self.request.autotuning.arg_mappings)
        """Script options that carry the micro-batch and accumulation: the user's arg_mappings, or
        the ones the target knows (a Hugging Face Trainer's)."""
        if self.arg_mappings and self.request.global_batch is None:
            # The global batch the command trains with now, held through the mapped options.
            self.request = parse_request(self.user_config, world_size=self.world,
                                         script_batch=self.target.script_batch(self.arg_mappings))
        at = self.request.autotuning
        self.dp = self.world // at.mp_size
        self.budget = self._budget(memory_per_device)
        self.results_dir = expand(results_dir or at.results_dir)
        claim(self.results_dir)  # a folder that is not zerotune's is refused before anything runs
        self.overwrite = at.overwrite if overwrite is None else overwrite
        self.time_budget = parse_duration(budget, what="budget (--time-budget)") if budget else None
        self.launcher = launcher or self.cluster.make_launcher()
        self.slots = self.cluster.slots(max_concurrent_trials)
        self.on_event = on_event or (lambda e: None)
        self.mixed_precision = any((self.user_config.get(k) or {}).get("enabled") for k in ("fp16", "bf16"))
        self.offload = offload
        self.retry_failed = retry_failed
        self.warm_trials = at.warm_trials if warm_trials is None else bool(warm_trials)
        self.custom_searcher = searcher
        self.candidates()  # a global batch no micro-batch divides is an error now, not at tune()
        self.result: TuningResult | None = None
        self.record: TuningRecord | None = None
        """The record of the latest tune(): its trials, notes and events."""
        self.own_spec = self.target.own_spec(self.request, self.dp)
        """The trial of the user's own configuration, the baseline of the payback figure (or None)."""

    # -- set-up --------------------------------------------------------------------------------
    def _budget(self, memory_per_device: int | str | None) -> int:
        if memory_per_device is not None:
            return parse_size(memory_per_device, what="--memory-per-device", limit=2**50)
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

    def default_searcher(self) -> Searcher:
        """The micro-batch search over the stages; a fresh one for each tune()."""
        at = self.request.autotuning
        gas = self.user_config.get("gradient_accumulation_steps")
        return MicroBatchSearch(
            stages=self.request.stages, candidates=self.candidates(), global_batch=self.request.global_batch,
            dp=self.dp, grad_accum=gas if isinstance(gas, int) and gas >= 1 else 1, budget=self.budget,
            metric=at.metric, num_micro_batches=at.num_tuning_micro_batch_sizes,
            memory=self.memory_model(), prune={s: r for s in self.request.stages
                                                if (r := invalid_reason(s, self.request.base(s)))})

    @property
    def mp(self) -> int:
        return self.request.autotuning.mp_size

    def memory_model(self, overrides: dict[int, tuple] | None = None) -> MemoryModel:
        """The memory model for this config: its precision, ZeRO buckets and offload per stage
        (``overrides``: per stage, what every trial of that stage sets, offload for example)."""

        def setup_for(stage: int, num_params: int) -> MemorySetup:
            spec = TrialSpec(stage=stage, micro_batch=1, overrides=(overrides or {}).get(stage, ()))
            return MemorySetup.from_config(trial_config(self.request.base(stage), spec, self.dp),
                                           num_params=num_params, dp=self.dp, mp=self.mp)

        info = self.request.autotuning.model_info
        known = (info.num_params if info else None) or self.target.num_params
        return MemoryModel(dp=self.dp, mixed_precision=self.mixed_precision, setup_for=setup_for, num_params=known)

    # -- the loop ------------------------------------------------------------------------------
    def identity(self) -> Identity:
        """What every trial of this tuning shares, for resume: a stored trial is reused only if
        its identity (plus its own ds_config) is the same."""
        at = self.request.autotuning
        code, args = self.target.identity()
        return Identity(code=code, args=args, topology=self.cluster.topology(), env=self.cluster.run_env(),
                        measure={"precision": self.measure.precision, "max_seconds": self.measure.max_seconds,
                                 "start_profile_step": at.start_profile_step, "end_profile_step": at.end_profile_step,
                                 "warmup": "adaptive" if self.adaptive_warmup else "fixed"},
                        failure={"trial_timeout": self.measure.trial_timeout,
                                 "stall_timeout": self.measure.stall_timeout, "budget": self.budget})

    def tune(self) -> TuningResult:
        """Run the search. Each call starts from a fresh state; finished trials on disk whose
        identity is unchanged are reused, so a rerun (or a second call) resumes. The results
        folder is locked for the tuning's whole run: a second tuning of it is refused."""
        previous = claim(self.results_dir)
        make_folder(self.results_dir)
        with FolderLock(self.results_dir):
            if self.overwrite:
                discard(self.results_dir, previous)
                previous = None
            self.overwrite = False  # a second tune() on this object resumes
            return self._tune(previous)

    def _tune(self, previous: dict[str, Any] | None) -> TuningResult:
        at = self.request.autotuning
        record = TuningRecord(self.results_dir, identity=self.identity(), session=self._session_info(),
                              previous=previous, retry_failed=self.retry_failed,
                              max_trials=at.tuner_num_trials, on_event=self.on_event)
        self.record, self.result = record, None
        searcher = self.custom_searcher or self.default_searcher()
        start = time.monotonic()
        self.launcher.preflight()  # a missing tool or an unreachable host: one error before any trial
        if line := leftovers_line(end_leftovers(self.results_dir), "an earlier, killed tuning of this folder"):
            record.note(line)
        if line := record.resume_line(self.config_for):
            record.note(line)
        if line := self.batch_options_line():
            record.note(line)
        record.clear_outputs()
        earlier = earlier_confirmation(self.results_dir)  # read before this tuning's record replaces it
        record.write_session("running")
        run = PhaseRun(self, record, start)
        confirmation = None
        try:
            for phase, stopper in self._phases(searcher, record):
                if not run.run(phase, stopper):
                    break
            if line := run.model.table():
                record.note(line)
            if (choice := choose_best(record.trials, at.metric)) is not None:
                if self.time_budget and time.monotonic() - start > self.time_budget:
                    record.note("the configurations within noise of the best were not measured again: the time "
                                "budget is spent")
                else:
                    confirmation = confirm(self, record, choice, earlier=earlier)
        except BaseException:
            self._end_processes(record)
            try:
                record.write_session("interrupted", wall=time.monotonic() - start)
            except ZerotuneError:
                pass  # the disk is full: the error being raised says so; finished trials are on disk
            raise
        self._end_processes(record)  # warm processes end with the tuning
        wall = time.monotonic() - start
        trials = record.trials
        choice = choose_best(trials, at.metric)
        best = choice.best if choice else None
        if confirmation is not None and confirmation.best is not None:
            best = next(t for t in trials if t.name == confirmation.best)
        notes = record.notes + ([confirmation.note] if confirmation is not None
                                else [choice.note] if choice and choice.note else [])
        best_config = self.final_config(best.spec) if best else None
        remeasured = confirmation.runs if confirmation is not None else []
        self.result = TuningResult(metric=at.metric, trials=list(trials), best=best,
                                   best_config=best_config, results_dir=self.results_dir, notes=notes,
                                   wall_time=wall, launched=record.launched, env=self.cluster.run_env(),
                                   confirmed=confirmation.confirmed if confirmation is not None else {},
                                   cost=tuning_cost(trials, best, self.own_spec, wall, remeasured=remeasured,
                                                    earlier_time=record.earlier_time))
        record.write_session("finished", wall=wall, notes=notes, best=best.name if best else None,
                             best_config=best_config, remeasured=[r.to_dict() for r in remeasured],
                             confirm_from_trial=confirmation.from_trial if confirmation is not None else None)
        from .report import write_outputs

        write_outputs(self)
        if best is None:
            raise NoFeasibleConfigError(no_choice_message(trials, self.results_dir, self.time_budget))
        return self.result

    def _end_processes(self, record: TuningRecord) -> None:
        """End the launcher's processes, then any process a trial left running outside them (a
        daemon the script started), which the summary names."""
        self.launcher.close()
        if line := leftovers_line(end_leftovers(self.results_dir, own=True), "this tuning's trials"):
            record.note(line)

    def _phases(self, searcher: Searcher, record: TuningRecord):
        """(searcher, stopping rule) in turn; each is built when the one before has finished."""
        from . import phases

        yield searcher, None
        if self.custom_searcher is not None:
            return
        if (offload := phases.offload_searcher(self, record)) is not None:
            yield offload, None
        yield from phases.knob_searchers(self, record)

    def config_for(self, spec: TrialSpec) -> dict[str, Any]:
        """The ds_config a trial of ``spec`` runs with."""
        return trial_config(self.request.base(spec.stage), spec, self.dp, script_fills=set(self.arg_mappings))

    def final_config(self, spec: TrialSpec) -> dict[str, Any]:
        """The config to train with after choosing ``spec``, in the form the target accepts."""
        return self.target.final_config(self.config_for(spec))

    def make_job(self, record: TuningRecord, spec: TrialSpec, cfg: dict[str, Any]) -> TrialJob:
        """Write the trial's folder (its config, exp.json) and the job that runs it."""
        d = record.store.trial_dir(spec.name)
        write_json(d / "ds_config.json", cfg)
        config = (d / "ds_config.json").resolve()
        at = self.request.autotuning
        job = TrialJob(spec=spec, trial_dir=d, script=self.target.script,
                       script_args=self.target.trial_args(config, self.mapped_args(spec)),
                       probe_fields=self.target.probe_fields(config),
                       program_launcher=self.target.program_launcher(record.store.root, config, self.num_gpus),
                       local_rank_arg=self.command.takes_local_rank(), num_gpus=self.num_gpus, budget=self.budget,
                       warmup_steps=max(1, at.start_profile_step - 1),  # timed from step start_profile_step on
                       adaptive_warmup=self.adaptive_warmup,
                       min_steps=max(3, at.end_profile_step - at.start_profile_step),
                       measure=self.measure, config=cfg, work_dir=record.store.root, **self.warm_plan(cfg))
        exp = {"name": spec.name, **spec.to_dict(), "ds_config": cfg}
        write_json(d / "exp.json", exp)
        if "exps_dir" in at.model_fields_set:  # DeepSpeed's layout, when the user asked for it
            Path(at.exps_dir).mkdir(parents=True, exist_ok=True)
            write_json(Path(at.exps_dir) / f"{spec.name}.json", exp)
        return job

    def make_confirm_job(self, record: TuningRecord, spec: TrialSpec, round_: int, seconds: float) -> TrialJob:
        """A re-measurement of a finished trial (round ``round_``), in a folder inside its own,
        measuring for about ``seconds`` (the trial's own limit if shorter) once it has as many
        timed steps as a trial needs at least."""
        job = self.make_job(record, spec, self.config_for(spec))
        d = job.trial_dir / f"confirm{round_}"
        if d.is_symlink() or (d.exists() and not d.is_dir()):
            d.unlink()  # a link is replaced, never followed
        d.mkdir(exist_ok=True)
        job.trial_dir, job.slot = d, self.slots[0]
        job.measure = replace(job.measure, max_seconds=min(job.measure.max_seconds, seconds))
        return job

    @property
    def adaptive_warmup(self) -> bool:
        """Warm-up ends when step times settle, unless the user fixed it with start_profile_step."""
        return "start_profile_step" not in self.request.autotuning.model_fields_set

    def warm_plan(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """Whether the trial of ``cfg`` runs warm, and why not where it cannot."""
        if not self.warm_trials:
            return {"warm": False, "cold_reason": "cold trials were asked for (--cold-trials, warm_trials: false)"}
        if self.cluster.multinode:
            return {"warm": False, "cold_reason": "warm trials run on one node only"}
        hpz = (cfg.get("zero_optimization") or {}).get("zero_hpz_partition_size", 1)
        if isinstance(hpz, (int, float)) and hpz > 1:
            # DeepSpeed keeps hpZ's process group for the process and asserts there is none on a
            # second engine.
            return {"warm": False, "cold_reason": "ZeRO++ hpZ (zero_hpz_partition_size) builds its group once per "
                                                  "process"}
        return {"warm": True}

    def batch_options_line(self) -> str | None:
        """How the trials give the script its batch sizes, where through its own options."""
        if not self.arg_mappings:
            return None
        names = {"train_micro_batch_size_per_gpu": "micro-batch", "gradient_accumulation_steps": "accumulation"}
        options = ", ".join(f"{names.get(k, k)} {flag}" for k, flag in self.arg_mappings.items())
        held = f"; global batch {self.request.global_batch} held" if self.request.global_batch else ""
        return f"{self.target.kind}: each trial sets its batch through the script's options ({options}){held}"

    def mapped_args(self, spec: TrialSpec) -> dict[str, str]:
        """The script options of :attr:`arg_mappings`, with the values of ``spec``."""
        values = {"train_micro_batch_size_per_gpu": spec.micro_batch, "gradient_accumulation_steps": spec.grad_accum}
        return {arg: str(values[key]) for key, arg in self.arg_mappings.items() if key in values}

    def _session_info(self) -> dict[str, Any]:
        own = self.own_spec
        return {"metric": self.request.autotuning.metric, "script": self.command.script,
                "args": list(self.command.args), "num_gpus": self.num_gpus, "num_nodes": self.num_nodes,
                "device": self.node.device, "budget": self.budget, "user_config": self.user_config,
                "env": self.cluster.run_env(),
                "own": own.to_dict() if own is not None else None}

    # -- after tuning --------------------------------------------------------------------------
    def write_optimal_config(self, path: str | Path) -> Path:
        from .report import write_optimal_config

        assert self.result is not None and self.result.best_config is not None, "call tune() first"
        return write_optimal_config(self.result.best_config, Path(path))

    def run_after_tuning(self, extra_env: dict[str, str] | None = None) -> int:
        """Train with the best config, started by the trials' launcher on the topology the tuning
        measured (every node of a hostfile), output streamed to this terminal; returns the exit
        status."""
        import sys

        result = self.result or self.tune()
        assert result.best is not None and result.best_config is not None
        config = self.results_dir / "ds_config_optimal.json"
        spec_path = self.results_dir / "run_probe.json"
        write_json(spec_path, {"mode": "run", "script": self.target.script,
                               "args": self.target.trial_args(config, self.mapped_args(result.best.spec)),
                               "local_rank_arg": self.command.takes_local_rank(), **self.target.probe_fields(config)})
        code = self.launcher.run_program(spec_path, self.num_gpus, extra_env or {},
                                         self.target.program_launcher(self.results_dir, config, self.num_gpus))
        sys.stdout.flush()
        return code
