"""zerotune's command line: one parser per subcommand (``zerotune tune --help`` lists tune's
options only), and the split between zerotune's own options and the user's command."""

from __future__ import annotations

import argparse

COMMANDS = {
    "tune": "run short, measured trials of the script and write the best config",
    "run": "tune, then train with the best config",
    "show": "print the summary of a finished or interrupted tuning",
    "report": "write RESULTS_DIR/report.html (figures embedded) and report/*.png",
    "estimate": "predict memory per ZeRO stage and offload, and the largest micro-batch that fits",
}
TUNE_USAGE = (
    "zerotune {name} [options] script.py [script args]\n"
    "       zerotune {name} [options] accelerate launch [launch options] script.py [script args]"
)
TOP_HELP = (
    """usage: zerotune {tune,run} [options] script.py [script args]
       zerotune {tune,run} [options] accelerate launch [launch options] script.py [script args]
       zerotune {show,report} RESULTS_DIR
       zerotune estimate (--params N | --hf-config FILE | --factory MOD:FN) [options]
       zerotune --version

Find the fastest DeepSpeed configuration for a training script on this machine.

commands:
"""
    + "".join(f"  {name:<9} {text}\n" for name, text in COMMANDS.items())
    + """
`zerotune COMMAND --help` lists the options of one command."""
)
TUNE_DESCRIPTION = """{text}.

The script's own arguments (everything from script.py on, or from `accelerate launch` on) are
passed through untouched; a DeepSpeed script names its ds_config with --deepspeed_config PATH (or
--deepspeed PATH, as Hugging Face's Trainer does); an Accelerate command names it in its config
file. The ds_config's "autotuning" section is read with DeepSpeed's key names."""


def tune_parser(name: str) -> argparse.ArgumentParser:
    """The options of ``zerotune tune`` and ``zerotune run`` (the user's command is not parsed)."""
    from ..trials import MEASURE_DEFAULTS

    p = argparse.ArgumentParser(
        prog=f"zerotune {name}",
        usage=TUNE_USAGE.format(name=name),
        description=TUNE_DESCRIPTION.format(text=COMMANDS[name].capitalize()),
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--num-gpus",
        "--num_gpus",
        type=int,
        default=None,
        help="processes per node (GPUs; on CPU, processes). Default: all GPUs, or 1 on CPU",
    )
    p.add_argument(
        "--num-nodes", "--num_nodes", type=int, default=None, help="nodes (default: 1, or every host of --hostfile)"
    )
    p.add_argument(
        "--hostfile",
        default=None,
        metavar="FILE",
        help="DeepSpeed hostfile ('hostname slots=N' per line) for multi-node trials",
    )
    p.add_argument("--include", default="", metavar="SPEC", help='hosts/slots to use, e.g. "worker-0@worker-1:0,2"')
    p.add_argument("--exclude", default="", metavar="SPEC", help='hosts/slots not to use, e.g. "worker-1:0"')
    p.add_argument(
        "--launcher",
        default="pdsh",
        choices=["pdsh", "openmpi", "mpich", "mvapich", "slurm", "impi", "torchrun"],
        help="how multi-node trials start: DeepSpeed's runner with this launcher, or torchrun agents",
    )
    p.add_argument(
        "--slurm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="trials as job steps of the Slurm allocation this runs in, over its nodes (default: inside "
        "salloc or sbatch, without --hostfile); --no-slurm: this node only",
    )
    p.add_argument(
        "--master-addr",
        "--master_addr",
        default=None,
        metavar="ADDR",
        help="rendezvous address of multi-node trials (default: the first host)",
    )
    p.add_argument(
        "--memory-per-device",
        default=None,
        metavar="SIZE",
        help="memory budget per process, e.g. 16GB; default: GPU memory, or RAM / processes on CPU",
    )
    p.add_argument(
        "--results-dir",
        default=None,
        metavar="DIR",
        help="where trials and outputs go (default: autotuning.results_dir, else autotuning_results)",
    )
    p.add_argument("--time-budget", default=None, metavar="T", help="launch no trial after this long, e.g. 20m")
    p.add_argument(
        "--trial-timeout",
        type=float,
        default=None,
        metavar="S",
        help=f"seconds before a trial is ended (default {MEASURE_DEFAULTS.trial_timeout:.0f})",
    )
    p.add_argument(
        "--max-concurrent-trials",
        type=int,
        default=None,
        metavar="N",
        help="trials at once, each on its own GPUs (default: GPUs // --num-gpus; 1 on CPU)",
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=None,
        metavar="S",
        help="end a trial whose training made no step on any rank for this long (a hang; default "
        f"{MEASURE_DEFAULTS.stall_timeout:.0f})",
    )
    p.add_argument(
        "--max-measure-seconds",
        type=float,
        default=None,
        metavar="S",
        help="measure a trial for at most this many seconds of timed steps (default "
        f"{MEASURE_DEFAULTS.max_measure_seconds:.0f})",
    )
    p.add_argument(
        "--remeasure-seconds",
        type=float,
        default=None,
        metavar="S",
        help="measure each configuration within noise of the best again, interleaved, for about this long "
        f"(default {MEASURE_DEFAULTS.remeasure_seconds:.0f})",
    )
    p.add_argument(
        "--remeasure-rounds",
        type=int,
        default=None,
        metavar="N",
        help=f"rounds of re-measurement at most (default {MEASURE_DEFAULTS.remeasure_rounds})",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        metavar="N",
        help=f"timed steps a trial takes at most (default {MEASURE_DEFAULTS.max_steps})",
    )
    p.add_argument(
        "--max-warmup-steps",
        type=int,
        default=None,
        metavar="N",
        help=f"steps warm-up takes at most before timing starts (default {MEASURE_DEFAULTS.max_warmup_steps})",
    )
    p.add_argument(
        "--search",
        default=None,
        metavar="WHAT",
        help="what to search around your own ds_config, the rest kept as you set it: any of stage, micro-batch, "
        "offload, knobs, comma-separated (default: the autotuning section's meanings where the config has one; "
        "else stage,micro-batch at your global batch, and offload where your config offloads)",
    )
    p.add_argument(
        "--engines",
        default=None,
        metavar="LIST",
        help="the engines to tune and choose across, comma-separated: deepspeed (ZeRO), fsdp (PyTorch FSDP2) "
        "or both, for Hugging Face Trainer and Accelerate scripts, whose engine zerotune switches "
        "(default: the engine the script is configured for)",
    )
    p.add_argument(
        "--fsdp-wrap",
        default=None,
        metavar="CLASSES|COUNT",
        help="FSDP2's unit: the model's block classes, each sharded as one, comma-separated, or a unit's "
        "parameter count such as 10M (default: the model's _no_split_modules, as Hugging Face models declare "
        "them; else the whole model is one unit)",
    )
    p.add_argument(
        "--tie-margin",
        type=float,
        default=None,
        metavar="F",
        help="how much speed memory headroom may cost: a leaner configuration within noise of the fastest "
        f"is chosen only where the fastest is shown at most this fraction faster (default {MEASURE_DEFAULTS.tie_margin}; "
        "0 keeps the fastest)",
    )
    p.add_argument(
        "--precision",
        type=float,
        default=None,
        help="stop measuring a trial once the 95%% interval of its step time is within this fraction "
        f"(default {MEASURE_DEFAULTS.precision})",
    )
    p.add_argument("--overwrite", action="store_true", help="discard finished trials instead of resuming")
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="run again the stored trials that crashed, timed out or ran out of memory (they are reused "
        "otherwise, unless the timeouts or memory budget that failed them changed)",
    )
    p.add_argument(
        "--cold-trials",
        action="store_true",
        help="start every trial in processes of its own (default: trials reuse warm processes, which "
        'saves the launch and start-up of each; also "warm_trials": false in the autotuning '
        "section)",
    )
    p.add_argument("--quiet", action="store_true", help="print only the result")
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="json: one JSON object per event on stdout, for machines (no other output there)",
    )
    p.add_argument(
        "--tensorboard",
        default=None,
        metavar="DIR",
        help="also write TensorBoard scalars per trial to DIR (MLflow is used when MLFLOW_TRACKING_URI "
        "is set and mlflow is installed)",
    )
    return p


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """``tune``/``run`` with zerotune's own options, and the user's command (script.py, or
    ``accelerate launch``, and everything after it, untouched: never given to an argument parser
    that could abbreviate or eat it)."""
    # The options that take a value, read from the tune parser itself: a list kept apart from it
    # went stale as options were added, and then took the option's value for the script.
    # (argparse keeps its actions in ``_actions``; it offers no public view of them.)
    takes_value = {s for a in tune_parser("tune")._actions for s in a.option_strings if a.nargs != 0}
    own: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--" and len(own) >= 1:  # the usual end of options: the command follows
            return own, argv[i + 1 :]
        if len(own) >= 1 and not a.startswith("-") and own[0] in ("tune", "run"):
            return own, argv[i:]
        own.append(a)
        if a in takes_value and i + 1 < len(argv):
            own.append(argv[i + 1])
            i += 1
        i += 1
    return own, []


def estimate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zerotune estimate",
        allow_abbrev=False,
        description="Predict per-device memory for each ZeRO stage and offload, and the "
        "largest micro-batch that fits, without training.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--params", help="parameter count, e.g. 1.3B, 350M, 7e9")
    src.add_argument("--hf-config", metavar="FILE", help="a Hugging Face style config.json")
    src.add_argument(
        "--factory",
        metavar="MOD:FN",
        help="module:function or file.py:function returning the model (built on the meta device)",
    )
    p.add_argument("--largest-layer", help="parameters of the largest layer, e.g. 50M (with --params)")
    p.add_argument("--activation-per-sample", metavar="SIZE", help="activation bytes per sample, e.g. 300MB")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (with --hf-config)")
    p.add_argument("--num-gpus", "--num_gpus", type=int, default=8, help="devices per node (default 8)")
    p.add_argument("--num-nodes", "--num_nodes", type=int, default=1)
    p.add_argument("--device-memory", default="80GB", metavar="SIZE", help="memory per device (default 80GB)")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="bf16")
    p.add_argument(
        "--overhead",
        default=None,
        metavar="SIZE",
        help="fixed runtime memory per device: CUDA context, allocator (default: measured with --profile, else 1GiB)",
    )
    p.add_argument("--global-batch", type=int, default=None, help="micro-batches must divide its share per device")
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.add_argument(
        "--profile",
        action="store_true",
        help="last option: --profile script.py [script args] runs one short real trial of the script "
        "(one process, with its --deepspeed_config) to measure parameters, activations per sample "
        "and overhead first",
    )
    return p


def results_parser(name: str) -> argparse.ArgumentParser:
    """``zerotune show`` and ``zerotune report``: one results folder."""
    p = argparse.ArgumentParser(
        prog=f"zerotune {name}", description=COMMANDS[name].capitalize() + ".", allow_abbrev=False
    )
    p.add_argument("results_dir", metavar="RESULTS_DIR", help="the results folder of a tuning")
    return p


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of the command ``name`` (one of COMMANDS): what the CLI parses with, and what
    its reference page is made from."""
    if name == "estimate":
        return estimate_parser()
    if name in ("show", "report"):
        return results_parser(name)
    return tune_parser(name)
