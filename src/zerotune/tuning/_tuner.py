"""The Autotuner: ask the searcher, launch, observe, store. The CLI and Lightning call this."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._api_check import checked
from .._errors import ConfigError, NoFeasibleConfigError, ZerotuneError
from .._files import make_folder, write_json
from ..launch import (
    Cluster,
    ClusterSettings,
    Launcher,
    Node,
    detect_node,
    end_leftovers,
    leftovers_line,
    trial_env,
)
from ..request import TuningRequest, config_file, load_ds_config, parse_engines, parse_request, parse_wrap
from ..results import (
    FolderLock,
    TuningEvent,
    TuningRecord,
    TuningResult,
    claim,
    compare_with_own,
    discard,
    earlier_confirmation,
    expand,
    no_choice_message,
    tuning_cost,
)
from ..search import OwnConfigSearch
from ..targets import Target, detect, require_config
from ..trials import MeasureSettings, choose_best
from ..units import parse_size
from ._confirm import confirm
from ._loop import PhaseRun
from ._settings import SearchSettings, settings_of
from ._trial_factory import TrialFactory

__all__ = ["Autotuner", "TuningEvent"]


class Autotuner:
    """Finds the fastest DeepSpeed configuration of a training command, then trains with it.

    Call order: construct (checks every argument and the ds_config; runs nothing but, for a
    Lightning script without a ds_config, the script up to its ``trainer.fit``), then
    :meth:`tune` (runs the trials; a second call resumes from disk), then optionally
    :meth:`write_optimal_config` or :meth:`run_after_tuning`. Each argument's type is checked
    once (a wrong one is a ``ValueError`` naming it).

    Args:
        command: The user's script and its arguments (``accelerate launch ...`` too), or a
            function ``train(ds_config: dict)`` defined at the top level of a .py file (each trial
            runs it in fresh processes, which call ``deepspeed.initialize(config=ds_config)``).
        ds_config: A dict or a path; default: the ``--deepspeed_config``/``--deepspeed`` value in
            the command. Its ``autotuning`` section is read with DeepSpeed's key names.
        results_dir: Where trials and outputs go (default: autotuning.results_dir); a non-empty
            folder that is not zerotune's is refused.
        overwrite: Remove the trial folders and outputs the folder's record names first.
        cluster: Where trials run (:class:`~zerotune.launch.ClusterSettings`: ``num_gpus``,
            ``num_nodes``, ``memory_per_device``, ``max_concurrent_trials``, ``warm_trials``,
            ``hostfile``, ``include``, ``exclude``, ``multinode_launcher``, ``master_addr``, ``slurm``).
        measure: How each trial is measured (:class:`~zerotune.trials.MeasureSettings`:
            ``precision``, ``max_measure_seconds``, ``trial_timeout``, ``stall_timeout``,
            ``max_steps``, ``max_warmup_steps``, ``remeasure_seconds``, ``remeasure_rounds``,
            ``tie_margin``).
        search: What is searched and for how long (:class:`~zerotune.tuning.SearchSettings`:
            ``searcher``, ``offload``, ``time_budget``, ``retry_failed``, ``search``); or only what
            to search around your own config, ``"stage,micro-batch"`` or a list (``--search``).
        on_event: Receives a :class:`~zerotune.TuningEvent` for each step of progress; the core
            never prints.
        launcher: How trials start (default: the cluster's, local or multi-node).
        node: What machine this is (default: found).
        target: What is tuned, where a face built it (the Lightning strategy's program); default:
            found from ``command`` (:func:`zerotune.targets.detect`; a script without a ds_config
            that imports Lightning is found to be a Lightning program).
        **options: Any field of the three settings by its name (``num_gpus=2``,
            ``precision=0.05``, ``time_budget="20m"``), for a settings object not given whole;
            None means its default. ``budget=``, the time budget's older name, still works and
            warns.
    """

    @checked
    def __init__(
        self,
        command: list[str] | Callable[[dict[str, Any]], Any],
        ds_config: str | Path | dict[str, Any] | None = None,
        *,
        results_dir: str | Path | None = None,
        overwrite: bool | None = None,
        cluster: ClusterSettings | None = None,
        measure: MeasureSettings | None = None,
        search: SearchSettings | str | list[str] | None = None,
        on_event: Callable[[TuningEvent], None] | None = None,
        launcher: Launcher | None = None,
        node: Node | None = None,
        target: Target | None = None,
        **options: Any,
    ):
        if isinstance(search, (str, list)):  # what to search around the user's config, alone
            options = {**options, "search": search}
            search = None
        settings = settings_of(options, {"cluster": cluster, "measure": measure, "search": search})
        self.cluster_settings: ClusterSettings = settings["cluster"]
        self.measure: MeasureSettings = settings["measure"]
        self.search: SearchSettings = settings["search"]
        machines = self.cluster_settings
        self.node = node or detect_node()
        self.target: Target = target or detect(
            command,
            ds_config,
            inspect_dir=expand(results_dir or "autotuning_results") / "_inspect",
            env=trial_env(1, self.node.device),
        )
        self.command = self.target.command
        num_gpus = self.target.processes(machines.num_gpus)
        self.user_config = load_ds_config(require_config(self.target.config_source(ds_config)))
        self.cluster = Cluster.build(
            machines, device=self.node.device, device_count=self.node.device_count, num_gpus=num_gpus
        )
        self.target.check_cluster(self.cluster)
        self.num_gpus, self.num_nodes, self.world = self.cluster.num_gpus, self.cluster.num_nodes, self.cluster.world
        around = self.search.dimensions
        self.request: TuningRequest = parse_request(self.user_config, world_size=self.world, search=around)
        self.arg_mappings = self.target.arg_mappings(self.request.space_config, self.request.autotuning.arg_mappings)
        """Script options that carry the micro-batch and accumulation: the user's arg_mappings, or
        the ones the target knows (a Hugging Face Trainer's)."""
        if self.arg_mappings:
            # The batch the command trains with now, given through the mapped options: the global
            # batch to hold where the config leaves it to the script, and the user's own config.
            self.request = parse_request(
                self.user_config,
                world_size=self.world,
                script_batch=self.target.script_batch(self.arg_mappings),
                search=around,
            )
        at = self.request.autotuning
        self.budget = self._budget(machines.memory_per_device)
        self.results_dir = expand(results_dir or at.results_dir)
        claim(self.results_dir)  # a folder that is not zerotune's is refused before anything runs
        self.overwrite = at.overwrite if overwrite is None else overwrite
        self.time_budget = self.search.time_budget_seconds
        self.launcher = launcher or self.cluster.make_launcher()
        self.slots = self.cluster.slots(machines.max_concurrent_trials)
        self.on_event = on_event or (lambda e: None)
        engines = parse_engines(self.search.engines) or (self.target.engine,)
        if "fsdp" in engines and self.target.fsdp is None:
            raise ConfigError(
                f"--engines fsdp: {self.target.kind} chooses its engine in its own code, so zerotune cannot "
                "switch it to FSDP2; it switches Hugging Face Trainer and Accelerate scripts (tune this one "
                "with --engines deepspeed)"
            )
        wrap, unit = parse_wrap(self.search.fsdp_wrap)
        self.trials = TrialFactory(
            request=self.request,
            target=self.target,
            cluster=self.cluster,
            command=self.command,
            measure=self.measure,
            budget=self.budget,
            arg_mappings=self.arg_mappings,
            offload=self.search.offload if self.search.offload is not None else self.request.offload,
            user_config=self.user_config,
            warm_trials=at.warm_trials if machines.warm_trials is None else machines.warm_trials,
            engines=engines,
            fsdp=dataclasses.replace(self.target.fsdp_settings(self.user_config, wrap), min_params=unit),
        )
        """Makes each trial of the tuning (configs, jobs, candidates, the memory model)."""
        self.result: TuningResult | None = None
        self.record: TuningRecord | None = None
        """The record of the latest tune(): its trials, notes and events."""

    # -- set-up --------------------------------------------------------------------------------
    def _budget(self, memory_per_device: int | str | None) -> int:
        if memory_per_device is not None:
            return parse_size(memory_per_device, what="--memory-per-device", limit=2**50)
        if self.node.device == "cuda" and self.node.device_memory:
            return self.node.device_memory
        return self.node.host_memory // self.num_gpus

    # -- the loop ------------------------------------------------------------------------------
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
        trials = self.trials
        record = TuningRecord(
            self.results_dir,
            identity=trials.identity(),
            session=self._session_info(),
            previous=previous,
            retry_failed=self.search.retry_failed,
            max_trials=at.tuner_num_trials,
            on_event=self.on_event,
        )
        self.record, self.result = record, None
        start = self.launcher.now()
        self.launcher.preflight()  # a missing tool or an unreachable host: one error before any trial
        self.launcher.check_storage(self.results_dir)  # every node writes where this one reads
        if line := leftovers_line(end_leftovers(self.results_dir), "an earlier, killed tuning of this folder"):
            record.note(line)
        if line := record.resume_line(trials.config_for):
            record.note(line)
        if line := trials.batch_options_line():
            record.note(line)
        record.clear_outputs()
        earlier = earlier_confirmation(self.results_dir)  # read before this tuning's record replaces it
        record.write_session("running")
        run = PhaseRun(trials, self.launcher, self.slots, record, start=start, time_budget=self.time_budget)
        confirmation = None
        try:
            for phase, stopper in self._phases(record):
                if not run.run(phase, stopper):
                    break
            if dropped := self.launcher.dropped:
                record.note("hosts left out of the pool: " + "; ".join(f"{n}: {why}" for n, why in dropped.items()))
            if line := run.model.table():
                record.note(line)
            if (choice := choose_best(record.ranked, at.metric, self.measure.tie_margin)) is not None:
                if self.time_budget and self.launcher.now() - start > self.time_budget:
                    record.note(
                        "the configurations within noise of the best were not measured again: the time budget is spent"
                    )
                else:
                    alive = [s for s in self.slots if run.alive(s)]
                    confirmation = (
                        confirm(trials, self.launcher, alive, record, choice, earlier=earlier) if alive else None
                    )
        except BaseException:
            self._end_processes(record)
            try:
                record.write_session("interrupted", wall=self.launcher.now() - start)
            except ZerotuneError:
                pass  # the disk is full: the error being raised says so; finished trials are on disk
            raise
        self._end_processes(record)  # warm processes end with the tuning
        training = self._training_cluster(record)
        wall = self.launcher.now() - start
        done = record.trials
        choice = choose_best(record.ranked, at.metric, self.measure.tie_margin)
        best = choice.best if choice else None
        if confirmation is not None and confirmation.best is not None:
            best = next(t for t in done if t.name == confirmation.best)
        notes = record.notes + (
            [confirmation.note] if confirmation is not None else [choice.note] if choice and choice.note else []
        )
        best_config = trials.final_config(best.spec) if best else None
        from ._engines import engine_lines

        engines = engine_lines(
            record,
            trials,
            at.metric,
            self.measure.tie_margin,
            best,
            confirmation.confirmed if confirmation is not None else {},
        )
        remeasured = confirmation.runs if confirmation is not None else []
        self.result = TuningResult(
            metric=at.metric,
            trials=list(done),
            best=best,
            best_config=best_config,
            results_dir=self.results_dir,
            notes=notes,
            wall_time=wall,
            launched=record.launched,
            env=self.cluster.run_env(),
            confirmed=confirmation.confirmed if confirmation is not None else {},
            tie_margin=self.measure.tie_margin,
            cost=(cost := tuning_cost(done, wall, remeasured=remeasured, earlier_time=record.earlier_time)),
            engines=engines,
        )
        self.result.own = compare_with_own(
            done, best, trials.own_spec, self.result.confirmed, at.metric, max(cost.total_time, cost.trial_time)
        )
        record.write_session(
            "finished",
            wall=wall,
            notes=notes,
            best=best.name if best else None,
            best_config=best_config,
            remeasured=[r.to_dict() for r in remeasured],
            confirm_from_trial=confirmation.from_trial if confirmation is not None else None,
        )
        from ._outputs import write_outputs

        write_outputs(self.result, self.target, training, trials.mapped_args(best.spec) if best else {})
        if best is None:
            raise NoFeasibleConfigError(no_choice_message(done, self.results_dir, self.time_budget))
        return self.result

    def _training_cluster(self, record: TuningRecord) -> Cluster:
        """Where the final command trains: the tuning's cluster, or, where a host of its first
        group left the pool, the first group that kept every host (a note says so)."""
        lost = set(self.launcher.dropped)
        hosts = self.cluster.hosts
        if not hosts or not lost & {h.name for h in hosts} or self.cluster.slurm_job is not None:
            return self.cluster  # under Slurm the command names no node
        group = next((g for g in self.cluster.groups if not lost & {h.name for h in g}), None)
        if group is None:
            return self.cluster
        record.note(
            f"the training's hosts lost {', '.join(sorted(lost & {h.name for h in hosts}))}: cmd_optimal.txt "
            f"trains on {', '.join(h.name for h in group)}"
        )
        return dataclasses.replace(self.cluster, hosts=group)

    def _end_processes(self, record: TuningRecord) -> None:
        """End the launcher's processes, then any process a trial left running outside them (a
        daemon the script started), which the summary names."""
        self.launcher.close()
        if line := leftovers_line(end_leftovers(self.results_dir, own=True), "this tuning's trials"):
            record.note(line)

    def _phases(self, record: TuningRecord):
        """(searcher, stopping rule) in turn; each is built when the one before has finished: the
        user's searcher alone, or the user's own config, each engine's micro-batch search, offload
        where needed, then the ZeRO knobs."""
        from . import _engines as engines
        from . import _phases as phases

        if self.search.searcher is not None:
            yield self.search.searcher, None
            return
        engines.check_numerics(record, self.trials)  # an engine that would train other numbers is left out
        run = [e for e in self.trials.engines if e not in record.unranked]
        if (own := self.trials.own_spec) is not None and "deepspeed" in run:
            yield OwnConfigSearch(own), None  # measured first: what the choice is compared with
        for engine in run:
            yield self.trials.micro_batch_search(engine), None
        if len(run) == 2:
            engines.check_losses(record, self.trials, self.request.autotuning.metric, self.measure.tie_margin)
        run = [e for e in run if e not in record.unranked]  # the losses may have left one out
        if "deepspeed" in run and (offload := phases.offload_searcher(self.trials, record)) is not None:
            yield offload, None
        if "fsdp" in run and (offload := phases.fsdp_offload_searcher(self.trials, record)) is not None:
            yield offload, None
        if "deepspeed" in run:
            yield from phases.knob_searchers(self.trials, record)

    def _session_info(self) -> dict[str, Any]:
        own = self.trials.own_spec
        return {
            "metric": self.request.autotuning.metric,
            "tie_margin": self.measure.tie_margin,
            "script": self.command.script,
            "args": list(self.command.args),
            "num_gpus": self.num_gpus,
            "num_nodes": self.num_nodes,
            "device": self.node.device,
            "budget": self.budget,
            "user_config": self.user_config,
            "env": self.cluster.run_env(),
            "target_outputs": list(self.target.output_files()),
            "own": own.to_dict() if own is not None else None,
        }

    # -- after tuning --------------------------------------------------------------------------
    def write_optimal_config(self, path: str | Path) -> Path:
        from ._outputs import write_optimal_config

        assert self.result is not None and self.result.best_config is not None, "call tune() first"
        return write_optimal_config(self.result.best_config, Path(path))

    def run_after_tuning(self, extra_env: dict[str, str] | None = None) -> int:
        """Train with the best config, started by the trials' launcher on the topology the tuning
        measured (every node of a hostfile), output streamed to this terminal; returns the exit
        status."""
        import sys

        result = self.result or self.tune()
        assert result.best is not None and result.best_config is not None
        spec, form = result.best.spec, self.trials.form(result.best.spec)
        # DeepSpeed's in the target's form; FSDP2's as its trial ran it (the forms read that one).
        config = (
            self.results_dir / "ds_config_optimal.json"
            if spec.engine == "deepspeed"
            else self.results_dir / result.best.name / config_file(spec)
        )
        spec_path = self.results_dir / "run_probe.json"
        write_json(
            spec_path,
            {
                "mode": "run",
                "script": self.target.script,
                "args": form.trial_args(config, self.trials.mapped_args(spec)),
                "local_rank_arg": self.command.takes_local_rank(),
                **form.probe_fields(config),
            },
        )
        code = self.launcher.run_program(
            spec_path,
            self.num_gpus,
            extra_env or {},
            form.program_launcher(self.results_dir, config, self.num_gpus),
        )
        sys.stdout.flush()
        return code
