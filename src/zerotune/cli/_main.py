"""`zerotune` commands. Only argument handling and rendering live here (the parsers in
cli_parsers): the work is Autotuner's."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):  # an ASCII-only terminal gets "?" for "±", not a crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    # No shell can pass a NUL byte, but main() can be called with one; no path or option holds it.
    if bad := next((a for a in argv if "\0" in a), None):
        print(
            _error(f"the argument {bad!r} contains a NUL byte, which no path or option can hold; remove it"),
            file=sys.stderr,
        )
        return 2
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`zerotune show DIR | head`): stop quietly, as a pipe's writer does;
        # stdout goes to /dev/null so that the interpreter's own flush at exit raises nothing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:  # a file zerotune was pointed at cannot be read or written: name it
        where = f" {e.filename}" if e.filename else ""
        print(_error(f"cannot use{where}: {e.strerror or e}; check the path and its permissions"), file=sys.stderr)
        return 2


def _error(message: object) -> str:
    from ._terminal_text import plain

    return f"zerotune: error: {plain(message)}"


def _main(argv: list[str]) -> int:
    from .._errors import ZerotuneError
    from ._parsers import COMMANDS, TOP_HELP, estimate_parser, results_parser, split_argv, tune_parser

    if not argv or argv[0] in ("-h", "--help"):
        print(TOP_HELP, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] in ("--version", "-V"):
        from .. import __version__

        print(f"zerotune {__version__}")
        return 0
    if argv[0] not in COMMANDS:
        print(
            _error(f"unknown command {argv[0]!r}; choose one of {', '.join(COMMANDS)} (zerotune --help lists them)"),
            file=sys.stderr,
        )
        return 2
    if argv[0] == "estimate":
        own = argv[1:]
        command = []
        if "--profile" in own:  # everything after it is the user's command, untouched
            i = own.index("--profile")
            own, command = own[: i + 1], own[i + 1 :]
        args = estimate_parser().parse_args(own)
        args.command = command
        try:
            from ._render import print_estimate

            return print_estimate(args)
        except ZerotuneError as e:
            print(_error(e), file=sys.stderr)
            return 2
    if argv[0] in ("show", "report"):
        args = results_parser(argv[0]).parse_args(argv[1:])
        args.command = argv[0]
        command = []
    else:
        own, command = split_argv(argv)
        args = tune_parser(own[0]).parse_args(own[1:])
        args.command = own[0]
    try:
        if args.command == "show":
            from ..results import load_results
            from ._render import print_summary

            result = load_results(args.results_dir)
            print_summary(result)
            if line := _end_leftovers(result.results_dir):
                print(f"zerotune: {line}", file=sys.stderr)
            return 0
        if args.command == "report":
            from ..report import write_report

            print(write_report(args.results_dir))
            return 0
        return _tune(args, command)
    except ZerotuneError as e:
        print(_error(e), file=sys.stderr)
        return 2


def _tune(args: argparse.Namespace, command: list[str]) -> int:
    from ..launch import ClusterSettings
    from ..trials import MeasureSettings
    from ..tuning import Autotuner, SearchSettings
    from ._progress import JsonEvents, ProgressPrinter
    from ._render import print_summary

    if not command:
        from ._parsers import TUNE_USAGE

        print(
            f"zerotune: error: no training script given\nusage: {TUNE_USAGE.format(name=args.command)}", file=sys.stderr
        )
        return 2
    import signal

    stopping = []

    def terminate(signum, frame):
        # Once: a second Ctrl-C (or SIGTERM) while the first unwinds would cut short the clean-up
        # that ends the trial's processes and removes their buffers.
        if not stopping:
            stopping.append(signum)
            raise KeyboardInterrupt  # unwinds through tune(), which ends the running trial's processes

    signal.signal(signal.SIGTERM, terminate)
    # Also when started with SIGINT ignored (a background job of a script inherits that): an
    # explicit interrupt still ends the trials and keeps the results.
    signal.signal(signal.SIGINT, terminate)
    json_log = args.log_format == "json"
    printer = JsonEvents() if json_log else ProgressPrinter(quiet=args.quiet)
    sinks: list = [printer]
    tuner = Autotuner(
        command,
        results_dir=args.results_dir,
        overwrite=True if args.overwrite else None,
        cluster=ClusterSettings(
            num_gpus=args.num_gpus,
            num_nodes=args.num_nodes,
            memory_per_device=args.memory_per_device,
            max_concurrent_trials=args.max_concurrent_trials,
            warm_trials=False if args.cold_trials else None,
            hostfile=args.hostfile,
            include=args.include,
            exclude=args.exclude,
            multinode_launcher=args.launcher,
            master_addr=args.master_addr,
            slurm=args.slurm,
        ),
        measure=MeasureSettings.of(**{f.name: getattr(args, f.name) for f in dataclasses.fields(MeasureSettings)}),
        search=SearchSettings(
            time_budget=args.time_budget,
            retry_failed=args.retry_failed,
            search=args.search,
            engines=args.engines,
            fsdp_wrap=args.fsdp_wrap,
        ),
        on_event=lambda e: [s(e) for s in sinks],
    )
    printer.watch(tuner)
    sinks += trackers(args.tensorboard)
    for tracker in sinks[1:]:
        tracker.start(tuner)
    result = None
    try:
        with printer:
            result = tuner.tune()
    except KeyboardInterrupt:
        print(
            f"\nzerotune: interrupted; finished trials are kept in {tuner.results_dir}. "
            "Rerun the same command to resume.",
            file=sys.stderr,
        )
        return 130
    finally:
        for tracker in sinks[1:]:
            tracker.end(result, "FINISHED" if result is not None else "KILLED")
    if json_log:
        printer.result(result)
    else:
        print_summary(result)
    if args.command == "run":
        print(f"training with {result.results_dir / 'ds_config_optimal.json'}", file=sys.stderr)
        try:
            return tuner.run_after_tuning()
        except KeyboardInterrupt:
            return 130
    return 0


def _end_leftovers(root) -> str | None:
    """End what a killed tuning of ``root`` left running, where no tuning holds the folder."""
    from ..launch import end_leftovers, leftovers_line
    from ..results import busy

    if busy(root):
        return None
    return leftovers_line(end_leftovers(root), "an earlier, killed tuning of this folder")


def trackers(tensorboard: str | None) -> list:
    """Experiment trackers: MLflow when wanted (see _tracking.mlflow_wanted), TensorBoard on request."""
    from . import _tracking as tracking

    out: list = []
    if tracking.mlflow_wanted():
        out.append(tracking.MlflowTracker())
    if tensorboard:
        out.append(tracking.TensorBoardTracker(tensorboard))
    return out
