"""Terminal rendering of results (rich); progress while tuning is in _progress.py."""

from __future__ import annotations

import shlex

from rich import box
from rich.console import Console
from rich.table import Table

from ..results import TuningResult
from ..trials import UNITS
from ..units import format_size
from ._terminal_text import safe


def print_summary(result: TuningResult, console: Console | None = None) -> None:
    """The stage table (80 columns: no vertical rules; the figures never wrap, a long trial name
    folds), the choice with the environment its figures hold in, notes, cost."""
    console = console or Console(highlight=False)
    by = "engine and stage" if result.engines else "ZeRO stage"
    table = Table(title=f"zerotune: {result.metric} by {by}", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("stage", "trials", "ok", "oom", "failed", "pruned"):
        table.add_column(col, no_wrap=True, justify="right")
    table.add_column(f"best {UNITS[result.metric]}", no_wrap=True)
    table.add_column("best trial", overflow="fold")
    for row in result.summary_rows():
        table.add_row(
            *(safe(str(row[k])) for k in ("stage", "trials", "ok", "oom", "failed", "pruned", "best", "best_trial"))
        )
    console.print(table)
    if line := result.state_line():
        console.print(f"[yellow]{safe(line)}[/]")
    elif result.best is None:
        console.print("[red]no configuration succeeded[/]")
    if result.best is not None:
        b = result.best
        label = "best" if result.state == "finished" else "best so far"
        console.print(
            f"[bold green]{label}:[/] {safe(b.name)}  {result.best_figures()}  peak {format_size(b.max_peak)}/rank"
        )
        if line := result.env_line():
            console.print(safe(line))
    for line in result.engines:
        console.print(safe(line))
    for line in result.own.lines() if result.own is not None else []:
        console.print(f"[bold]{safe(line)}[/]" if line.startswith("your config") else safe(line))
    for note in result.notes:
        console.print(f"[dim]note:[/] {safe(note)}")  # notes quote trial reasons: never markup
    for line in result.cost.lines() if result.cost is not None else []:
        console.print(f"[dim]{safe(line)}[/]")
    where = str(result.results_dir)
    files = result.outputs()
    console.print(f"results: {safe(where)}/" + (f" ({', '.join(files)})" if files else ""))
    # A command to copy is never broken by an inserted newline (one at a space inside the quoted
    # path makes another path of it): on a line of its own, folded by the terminal if too long.
    console.print(f"figures: zerotune report {safe(shlex.quote(where))}", soft_wrap=True)


def print_estimate(args) -> int:
    """`zerotune estimate`: the table (or JSON) of stage x offload predictions."""
    import json

    from ._estimate import from_args

    est = from_args(args)
    size, dp, device_memory, overhead = est.size, est.devices, est.device_memory, est.overhead
    if args.json:
        print(
            json.dumps(
                {
                    "model": {
                        "num_params": size.num_params,
                        "largest_layer": size.largest_layer,
                        "activation_per_sample": size.activation_per_sample,
                        "source": size.source,
                    },
                    "devices": dp,
                    "device_memory": device_memory,
                    "precision": args.precision,
                    "rows": est.rows,
                },
                indent=2,
            )
        )
        return 0
    console = Console(highlight=False)
    t = Table(
        title=f"zerotune estimate: {size.num_params / 1e9:.3g}B parameters, {dp} devices "
        f"({args.num_nodes} node(s)), {args.precision}, {format_size(device_memory)} per device"
    )
    for col in ("stage", "offload"):
        t.add_column(col, no_wrap=True)  # the names whole; the figures' columns fold their headers
    for col in ("device (mb 1)", "host per node", "largest micro-batch"):
        t.add_column(col)
    for r in est.rows:
        off = (
            "+".join(
                n for n, v in (("optimizer", r["offload_optimizer"]), ("params", r["offload_param"])) if v != "none"
            )
            or "none"
        )
        fits = r["largest_micro_batch"]
        off = "all states" if r["engine"] == "fsdp" and off != "none" else off
        t.add_row(
            r["setting"],
            off,
            format_size(r["device_bytes"]),
            format_size(r["host_bytes_per_node"]),
            "[red]does not fit[/]" if fits is None else str(fits),
        )
    console.print(t)
    console.print(f"[dim]model: {safe(size.source)}; fixed overhead {format_size(overhead)} per device[/]")
    if size.activation_per_sample is None:
        console.print(
            "[dim]activations unknown (give --hf-config or --activation-per-sample): '?' means the model "
            "states fit at micro-batch 1 and the limit depends on activations[/]"
        )
    return 0
