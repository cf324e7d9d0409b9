"""Making the trials of one tuning: the ds_config of a point of the search, the job that runs
it (or measures it again), where it runs warm, the script options that carry its batch sizes,
the micro-batch candidates and the memory model. The loop, the phases and the confirmation
receive this factory, never the tuner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._files import write_json
from ..launch import Cluster, Slot, TrialJob
from ..models import MemoryModel, MemorySetup
from ..request import (
    FsdpSettings,
    TuningRequest,
    config_file,
    ds_equivalent,
    fsdp_config,
    invalid_reason,
    trial_config,
)
from ..results import Identity, ResultStore
from ..search import MicroBatchSearch
from ..targets import Target, UserCommand
from ..trials import MeasureSettings, TrialSpec


class TrialFactory:
    """What every trial of a tuning is made from (the request, the target, the cluster, the
    measurement settings and the memory budget), and the trials made from it."""

    def __init__(
        self,
        *,
        request: TuningRequest,
        target: Target,
        cluster: Cluster,
        command: UserCommand,
        measure: MeasureSettings,
        budget: int,
        arg_mappings: dict[str, str],
        warm_trials: bool,
        offload: bool | None,
        user_config: dict[str, Any],
        engines: tuple[str, ...] = ("deepspeed",),
        fsdp: FsdpSettings | None = None,
    ):
        """``engines``: what the trials train with (see SearchSettings.engines); ``fsdp``: what
        FSDP2 trials keep of the user's setup."""
        self.request, self.target, self.cluster, self.command = request, target, cluster, command
        self.engines, self.fsdp = engines, fsdp or FsdpSettings()
        self.measure, self.budget, self.arg_mappings = measure, budget, arg_mappings
        self.warm_trials, self.offload, self.user_config = warm_trials, offload, user_config
        self.dp = cluster.world // request.autotuning.mp_size
        self.mixed_precision = any((user_config.get(k) or {}).get("enabled") for k in ("fp16", "bf16"))
        self.candidates()  # a global batch no micro-batch divides is an error now, not at tune()
        self.own_spec = target.own_spec(request, self.dp)
        """The trial of the user's own configuration, the baseline of the payback figure (or None)."""

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
            raise ConfigError(
                f"no micro-batch between {lo} and {hi} divides the {per_rank} samples per process of "
                f"the global batch {req.global_batch}; widen the micro-batch bounds or change "
                "max_train_batch_size"
            )
        return out

    def micro_batch_search(self, engine: str, overrides: dict[int, tuple] | None = None) -> MicroBatchSearch:
        """The micro-batch search of one engine: DeepSpeed over the config's stages, FSDP2 over
        resharding and keeping the parameters (``overrides``: what every trial of a stage sets)."""
        at = self.request.autotuning
        gas = self.user_config.get("gradient_accumulation_steps")
        fsdp = engine == "fsdp"
        stages = sorted(overrides) if overrides else [2, 3] if fsdp else self.request.stages
        return MicroBatchSearch(
            stages=stages,
            candidates=self.candidates(),
            global_batch=self.request.global_batch,
            dp=self.dp,
            grad_accum=gas if isinstance(gas, int) and gas >= 1 else 1,
            budget=self.budget,
            metric=at.metric,
            tie_margin=self.measure.tie_margin,
            num_micro_batches=at.num_tuning_micro_batch_sizes,
            memory=self.memory_model(overrides, engine=engine),
            prune={} if fsdp else {s: r for s in stages if (r := invalid_reason(s, self.request.base(s)))},
            overrides=overrides,
            engine=engine,
        )

    @property
    def mp(self) -> int:
        return self.request.autotuning.mp_size

    def memory_model(self, overrides: dict[int, tuple] | None = None, *, engine: str = "deepspeed") -> MemoryModel:
        """The memory model for this config: its precision, ZeRO buckets and offload per stage
        (``overrides``: per stage, what every trial of that stage sets, offload for example);
        FSDP2's stages through the ZeRO stages whose memory they resemble (see ds_equivalent)."""

        def setup_for(stage: int, num_params: int) -> MemorySetup:
            spec = TrialSpec(stage=stage, micro_batch=1, overrides=(overrides or {}).get(stage, ()), engine=engine)
            cfg = self.config_for(spec)
            cfg = ds_equivalent(cfg) if engine == "fsdp" else cfg
            return MemorySetup.from_config(cfg, num_params=num_params, dp=self.dp, mp=self.mp)

        info = self.request.autotuning.model_info
        known = (info.num_params if info else None) or self.target.num_params
        return MemoryModel(dp=self.dp, mixed_precision=self.mixed_precision, setup_for=setup_for, num_params=known)

    def identity(self) -> Identity:
        """What every trial of this tuning shares, for resume: a stored trial is reused only if
        its identity (plus its own ds_config) is the same."""
        at = self.request.autotuning
        code, args = self.target.identity()
        return Identity(
            code=code,
            args=args,
            topology=self.cluster.topology(),
            env=self.cluster.run_env(),
            measure={
                "precision": self.measure.precision,
                "max_seconds": self.measure.max_measure_seconds,
                "max_steps": self.measure.max_steps,
                "max_warmup": self.measure.max_warmup_steps,
                "start_profile_step": at.start_profile_step,
                "end_profile_step": at.end_profile_step,
                "warmup": "adaptive" if self.adaptive_warmup else "fixed",
            },
            failure={
                "trial_timeout": self.measure.trial_timeout,
                "stall_timeout": self.measure.stall_timeout,
                "budget": self.budget,
            },
        )

    def config_for(self, spec: TrialSpec) -> dict[str, Any]:
        """The config a trial of ``spec`` runs with: a ds_config, or an FSDP2 config."""
        if spec.engine == "fsdp":
            return fsdp_config(spec, self.fsdp)
        return trial_config(self.request.base(spec.stage), spec, self.dp, script_fills=set(self.arg_mappings))

    def form(self, spec: TrialSpec):
        """What runs a trial of ``spec`` and trains with it: the target, or its FSDP2 form."""
        form = self.target if spec.engine == "deepspeed" else self.target.fsdp
        assert form is not None, f"{self.target.kind} has no FSDP2 form (checked when the engines were read)"
        return form

    def final_config(self, spec: TrialSpec) -> dict[str, Any]:
        """The config to train with after choosing ``spec``, in the form the target accepts."""
        return self.form(spec).final_config(self.config_for(spec))

    def make_job(self, store: ResultStore, spec: TrialSpec, cfg: dict[str, Any]) -> TrialJob:
        """Write the trial's folder in ``store`` (its config, exp.json) and the job that runs it."""
        d = store.trial_dir(spec.name)
        write_json(d / config_file(spec), cfg)
        config = (d / config_file(spec)).resolve()
        at = self.request.autotuning
        form = self.form(spec)
        job = TrialJob(
            spec=spec,
            trial_dir=d,
            script=self.target.script,
            script_args=form.trial_args(config, self.mapped_args(spec)),
            probe_fields=form.probe_fields(config),
            program_launcher=form.program_launcher(store.root, config, self.cluster.num_gpus),
            local_rank_arg=self.command.takes_local_rank(),
            num_gpus=self.cluster.num_gpus,
            budget=self.budget,
            warmup_steps=max(1, at.start_profile_step - 1),  # timed from step start_profile_step on
            adaptive_warmup=self.adaptive_warmup,
            min_steps=max(3, at.end_profile_step - at.start_profile_step),
            measure=self.measure,
            config=cfg,
            work_dir=store.root,
            **self.warm_plan(cfg),
        )
        exp = {"name": spec.name, **spec.to_dict(), ("fsdp_config" if spec.engine == "fsdp" else "ds_config"): cfg}
        write_json(d / "exp.json", exp)
        if "exps_dir" in at.model_fields_set:  # DeepSpeed's layout, when the user asked for it
            Path(at.exps_dir).mkdir(parents=True, exist_ok=True)
            write_json(Path(at.exps_dir) / f"{spec.name}.json", exp)
        return job

    def make_confirm_job(self, store: ResultStore, spec: TrialSpec, round_: int, slot: Slot) -> TrialJob:
        """A re-measurement of a finished trial (round ``round_``) on ``slot``, in a folder inside
        its own, measuring for its window (measure.window_seconds) once it has as many timed
        steps as a trial needs at least."""
        job = self.make_job(store, spec, self.config_for(spec))
        d = job.trial_dir / f"confirm{round_}"
        if d.is_symlink() or (d.exists() and not d.is_dir()):
            d.unlink()  # a link is replaced, never followed
        d.mkdir(exist_ok=True)
        job.trial_dir, job.slot = d, slot
        job.window_seconds = self.measure.window_seconds
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
        if cfg.get("engine") == "fsdp":
            # Accelerate keeps the distributed setup of a process's first Accelerator (DeepSpeed's or
            # plain data parallelism) for the process.
            return {"warm": False, "cold_reason": "FSDP2 trials run in processes of their own"}
        hpz = (cfg.get("zero_optimization") or {}).get("zero_hpz_partition_size", 1)
        if isinstance(hpz, (int, float)) and hpz > 1:
            # DeepSpeed keeps hpZ's process group for the process and asserts there is none on a
            # second engine.
            return {
                "warm": False,
                "cold_reason": "ZeRO++ hpZ (zero_hpz_partition_size) builds its group once per process",
            }
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
