"""A fake launcher: trials are answered from a synthetic machine instead of real processes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from zerotune.launch import Launcher, TrialJob
from zerotune.trials._trial import Measurement, TrialResult, TrialSpec, TrialState

MIB = 1024**2
TIGHT_MEMORY = "4608MiB"
"""A budget near the default FakeMachine's stage 1 peak at micro-batch 8 (3800 MiB, 82% of it):
where memory headroom is weighed against speed (see ranking.headroom_matters)."""


@dataclass
class FakeMachine:
    """peak(stage, mb) = static[stage] + per_sample * mb; step time from a throughput curve."""

    static: dict[int, int] = field(default_factory=lambda: {0: 4000 * MIB, 1: 3000 * MIB, 2: 2500 * MIB, 3: 2000 * MIB})
    per_sample: int = 100 * MIB
    speed: dict[int, float] = field(default_factory=lambda: {0: 1.0, 1: 1.1, 2: 1.05, 3: 0.8})
    rel_ci: float = 0.01
    rel_ci_of: dict[int, float] = field(default_factory=dict)
    """Per stage, a relative interval that stage's measurements have instead of rel_ci."""
    crash: set[str] = field(default_factory=set)
    """Trial names that crash."""
    hang: set[int] = field(default_factory=set)
    """Stages whose trials hang and end at the trial timeout."""
    offload_keeps: float = 0.25
    """Share of the model states left on the device with optimizer offload to CPU."""
    num_params: int = 10_000_000
    knob_speed: dict = field(default_factory=dict)
    """Throughput factor per (dotted key, value) override, e.g. {("zero_optimization.overlap_comm", True): 1.2}."""
    mb_speed: dict[int, float] = field(default_factory=dict)
    """Throughput factor per micro-batch on every stage, e.g. {32: 0.8}: a best micro-batch below the largest."""
    trial_seconds: float = 0.0
    """Wall time each trial and re-measurement reports."""
    left_out: dict[str, list[float]] = field(default_factory=dict)
    """Per trial name, step times its measurement left out as disturbances."""
    stops_early: bool = False
    """Trials stop after two timed steps where those show them unable to beat the job's to_beat
    (as the probe decides, see step_stats.slower_beyond); their 95% interval is then that of
    two steps at rel_ci's spread."""
    capped: set[int] = field(default_factory=set)
    """Stages whose measurements end at their time cap without settling (stable: false)."""
    tied: set[str] = field(default_factory=set)
    """Trial names that end as the probe's tie stop ends them (three timed steps, tied), where
    their job has a leader to be tied with (to_beat)."""
    figures: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per trial name, the (throughput, relative interval) it measures instead of the curve's."""
    lazy: dict[int, int] = field(default_factory=dict)
    """Per stage, bytes its ranks allocate only after the first forward (DeepSpeed's gradient
    buckets): in the peak, not in the static reading, whatever the micro-batch."""
    reduce_bucket_bytes: int = 0
    """Extra peak bytes per element of zero_optimization.reduce_bucket_size, up to the model's size
    (a bucket holds at most every gradient), as zerotune's memory model counts it."""
    fsdp_speed: dict[int, float] = field(default_factory=lambda: {2: 1.2, 3: 0.9})
    """Per FSDP2 stage (2 keeps the parameters, 3 reshards), the speed factor of its trials."""
    losses: list[float] = field(default_factory=lambda: [8.0, 7.9, 7.85, 7.8])
    """The first steps' mean losses every trial reports (relative to one another, see loss_scale)."""
    loss_scale: dict[str, float] = field(default_factory=lambda: {"deepspeed": 1.0, "fsdp": 0.5})
    """Per engine, the constant factor its framework scales the model's loss by (the Hugging Face
    Trainer's normalization differs by engine)."""
    fsdp_losses: list[float] | None = None
    """The losses FSDP2 trials report instead of ``losses`` (a training of other numbers)."""

    @classmethod
    def analytic(cls, num_params: int, overhead: int, dp: int = 2, **kw) -> FakeMachine:
        """A machine whose statics are exactly zerotune's fp32 Adam model states plus an overhead,
        as a real one is to within the model's accuracy."""
        from zerotune.models._memory import model_states
        from zerotune.models._memory_terms import MemorySetup

        static = {
            s: overhead
            + int(
                model_states(
                    MemorySetup(
                        num_params=num_params,
                        dp=dp,
                        stage=s,
                        reduce_bucket_size=5e8,
                        allgather_bucket_size=5e8,
                        overlap_comm=s == 3,
                        prefetch_bucket_size=5e7,
                    )
                )
            )
            for s in range(4)
        }
        return cls(static=static, num_params=num_params, **kw)

    def peak(self, spec: TrialSpec) -> int:
        static = self.static[spec.stage]
        if any(k.endswith("offload_optimizer.device") or k == "fsdp.offload" for k, _ in spec.overrides):
            static = int(static * self.offload_keeps)
        bucket = dict(spec.overrides).get("zero_optimization.reduce_bucket_size", 0)
        static += self.lazy.get(spec.stage, 0)
        return (
            static + self.per_sample * spec.micro_batch + int(self.reduce_bucket_bytes * min(bucket, self.num_params))
        )

    def throughput(self, spec: TrialSpec) -> float:
        if spec.name in self.figures:
            return self.figures[spec.name][0]
        # Saturating in the micro-batch, scaled per stage and by the knobs.
        factor = math.prod(self.knob_speed.get((k, v), 1.0) for k, v in spec.overrides)
        factor *= self.mb_speed.get(spec.micro_batch, 1.0)
        speed = self.fsdp_speed[spec.stage] if spec.engine == "fsdp" else self.speed[spec.stage]
        return 1000.0 * speed * factor * (1 - math.exp(-spec.micro_batch / 8))

    def losses_of(self, spec: TrialSpec) -> list[float]:
        losses = self.fsdp_losses if spec.engine == "fsdp" and self.fsdp_losses is not None else self.losses
        return [v * self.loss_scale[spec.engine] for v in losses]


class FakeLauncher(Launcher):
    def __init__(self, machine: FakeMachine | None = None, interrupt_at: int | None = None):
        self.machine = machine or FakeMachine()
        self.jobs: list[TrialJob] = []
        self.interrupt_at = interrupt_at
        self.closed = False

    def run(self, job: TrialJob) -> TrialResult:
        if self.interrupt_at is not None and len(self.jobs) == self.interrupt_at:
            raise KeyboardInterrupt
        self.jobs.append(job)
        m, spec = self.machine, job.spec
        peak = m.peak(spec)
        base = dict(
            spec=spec,
            peak_memory=[peak, peak],
            static_memory=[m.static[spec.stage]] * 2,
            memory_kind="fake",
            num_params=m.num_params,
            budget=job.budget,
            wall_time=m.trial_seconds,
            losses=m.losses_of(spec),
        )
        if spec.name in m.crash:
            return TrialResult(state=TrialState.CRASHED, reason="RuntimeError: boom", **base)
        if spec.stage in m.hang:
            return TrialResult(state=TrialState.TIMEOUT, reason="hung: no step for 120 s", **base)
        if job.budget and peak > job.budget:
            return TrialResult(state=TrialState.OOM, reason="CUDA out of memory", **base)
        samples = spec.micro_batch * spec.grad_accum * (job.num_gpus)
        step = samples / m.throughput(spec)
        rel_ci = m.figures[spec.name][1] if spec.name in m.figures else m.rel_ci_of.get(spec.stage, m.rel_ci)
        meas = Measurement(
            samples_per_step=samples,
            step_time_mean=step,
            step_time_std=step * rel_ci,
            step_time_ci95=step * rel_ci,
            steps_measured=10,
            stable=spec.stage not in m.capped,
            left_out=m.left_out.get(spec.name, []),
            left_out_median=step if spec.name in m.left_out else None,
        )
        if job.settle:
            meas = measured_until_settled(meas, job.settle)
        elif m.stops_early and job.to_beat:
            meas = stopped_early(meas, job.to_beat)
        if spec.name in m.tied and job.to_beat and not meas.early_stop:
            from dataclasses import replace

            ci = step * rel_ci * math.sqrt(10 / 3)  # three steps at the spread of ten
            meas = replace(meas, steps_measured=3, stable=False, tied=True, step_time_ci95=ci, step_time_df=2.0)
        return TrialResult(state=TrialState.OK, measurement=meas, **base)

    def close(self) -> None:
        self.closed = True


def stopped_early(meas: Measurement, to_beat: dict) -> Measurement:
    """``meas`` as the probe ends it after two timed steps, where those show it cannot beat
    ``to_beat`` (a throughput); unchanged where they do not."""
    from dataclasses import replace

    from zerotune.trials._step_stats import slower_beyond, t95_df

    per_sample, rel = meas.step_time_mean / meas.samples_per_step, meas.step_time_ci95 / meas.step_time_mean
    se = per_sample * rel * math.sqrt(meas.steps_measured / 2) / t95_df(meas.steps_measured - 1)
    lead = 1 / to_beat["value"]
    lead_df = math.inf if to_beat.get("df") is None else to_beat["df"]
    if not slower_beyond((per_sample, se, 1.0), (lead, lead * to_beat.get("rel_se", 0.0), lead_df)):
        return meas
    ci = se * t95_df(1) * meas.samples_per_step
    return replace(
        meas,
        steps_measured=2,
        stable=False,
        step_time_ci95=ci,
        step_time_std=ci / t95_df(1) * math.sqrt(2),
        step_time_df=1.0,
        early_stop=True,
        lost_to=to_beat["value"],
        lost_to_metric=to_beat["metric"],
    )


def measured_until_settled(meas: Measurement, settle: dict, cap: int = 40) -> Measurement:
    """As the probe measures a re-measurement that has a comparison to settle: on past its window
    (the fake's 10 steps), step by step (its interval narrowing as one over the root of the
    steps, its mean where it is), while the steps left before ``cap`` could settle it."""
    from dataclasses import replace

    from zerotune.trials._step_stats import Figure, settle_verdict, t95_df

    n, rel = meas.steps_measured, meas.step_time_ci95 / meas.step_time_mean
    while n < cap:
        ci = rel * math.sqrt(meas.steps_measured / n)
        value = settle["scale"] / meas.step_time_mean if settle["maximize"] else meas.step_time_mean
        if settle_verdict(Figure(value, value * ci, ci / t95_df(n - 1), n - 1), settle, more=cap - n) != "open":
            break
        n += 1
    ci = meas.step_time_mean * rel * math.sqrt(meas.steps_measured / n)
    return replace(meas, steps_measured=n, step_time_ci95=ci, step_time_std=ci / t95_df(n - 1) * math.sqrt(n))


class DriftingLauncher(FakeLauncher):
    """First measurements from ``machine``; re-measurements (confirm folders) from ``again``."""

    def __init__(self, machine, again):
        super().__init__(machine)
        self.again = again

    def run(self, job):
        if job.trial_dir.name.startswith("confirm"):
            first, self.machine = self.machine, self.again
            try:
                return super().run(job)
            finally:
                self.machine = first
        return super().run(job)


def confirms_of(tuner):
    """The re-measurements (confirm folders) a tuner with a fake launcher ran, in order."""
    return [j for j in tuner.launcher.jobs if j.trial_dir.name.startswith("confirm")]
