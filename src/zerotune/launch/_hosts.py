"""Which hosts and slots a multi-node trial uses: DeepSpeed's hostfile, ``--include`` and
``--exclude``, read with DeepSpeed's meanings.

A hostfile has one ``hostname slots=N`` per line (``#`` starts a comment). A filter is
``NODE_SPEC[@NODE_SPEC ...]`` with ``NODE_SPEC = NAME[:SLOT[,SLOT ...]]``: ``--include
"worker-0@worker-1:0,2"`` uses every slot of worker-0 and slots 0 and 2 of worker-1;
``--exclude "worker-1:0"`` uses everything but slot 0 of worker-1.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigError

_LINE = re.compile(r"^(\S+)\s+slots\s*=\s*(\d+)$")
LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}
MAX_SLOTS = 4096
"""Far above the devices of any node; bounds the slot lists built from a hostfile."""


@dataclass(frozen=True)
class Host:
    name: str
    slots: tuple[int, ...]
    """Device ids on that host that trials may use."""

    @property
    def local(self) -> bool:
        """This machine: started directly, without ssh."""
        return self.name in LOCAL_NAMES or self.name in (socket.gethostname(), socket.getfqdn())


def read_hostfile(path: str | Path) -> dict[str, int]:
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ConfigError(
            f"--hostfile {str(p)!r} cannot be read ({e.strerror}); give a file with one 'hostname slots=N' per line"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"--hostfile {str(p)!r} is not UTF-8 text; give a file with one 'hostname slots=N' per line"
        ) from None
    except ValueError:  # a NUL in the path
        raise ConfigError(
            f"--hostfile {str(p)!r} is not a path (it holds a NUL character); give the path of "
            "a file with one 'hostname slots=N' per line"
        ) from None
    hosts: dict[str, int] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m or not 1 <= int(m.group(2)) <= MAX_SLOTS:
            raise ConfigError(
                f"--hostfile {str(p)!r} line {number}: {raw.strip()!r} is not 'hostname slots=N' "
                f"with N from 1 to {MAX_SLOTS}"
            )
        if m.group(1) in hosts:
            raise ConfigError(f"--hostfile {str(p)!r} line {number}: host {m.group(1)!r} is listed twice")
        hosts[m.group(1)] = int(m.group(2))
    if not hosts:
        raise ConfigError(f"--hostfile {str(p)!r} lists no host; add lines such as 'worker-0 slots=8'")
    return hosts


def _parse_filter(text: str, what: str, pool: dict[str, list[int]]) -> dict[str, list[int] | None]:
    """``{host: slots}`` of a filter string; None: every slot of that host."""
    out: dict[str, list[int] | None] = {}
    for spec in text.split("@"):
        name, _, slots = spec.partition(":")
        if not name or name not in pool:
            raise ConfigError(f"{what} {text!r}: host {name!r} is not in the hostfile ({', '.join(pool)})")
        if not slots:
            out[name] = None
            continue
        try:
            ids = [int(s) for s in slots.split(",")]
        except ValueError:
            raise ConfigError(f"{what} {text!r}: slots of {name!r} must be numbers, e.g. {name}:0,1") from None
        bad = [i for i in ids if i not in pool[name]]
        if bad:
            raise ConfigError(f"{what} {text!r}: host {name!r} has no slot {bad[0]} (it has {pool[name]})")
        out[name] = ids
    return out


def host_groups(
    hostfile: dict[str, int], *, num_nodes: int, num_gpus: int, include: str = "", exclude: str = ""
) -> list[tuple[Host, ...]]:
    """The hosts of the hostfile (after the filters) as disjoint groups of ``num_nodes``, in
    hostfile order, each host with its first ``num_gpus`` slots: where concurrent multi-node
    trials run, each on the topology the training uses. A host with fewer slots is left out."""
    pool = [h for h in _filtered(hostfile, include, exclude) if len(h.slots) >= num_gpus]
    pool = [Host(h.name, h.slots[:num_gpus]) for h in pool]
    return [tuple(pool[i : i + num_nodes]) for i in range(0, len(pool) - num_nodes + 1, num_nodes)]


def _filtered(hostfile: dict[str, int], include: str, exclude: str) -> list[Host]:
    if include and exclude:
        raise ConfigError("--include and --exclude cannot both be given; use one of them")
    pool = {h: list(range(n)) for h, n in hostfile.items()}
    if include:
        chosen = _parse_filter(include, "--include", pool)
        pool = {h: (chosen[h] if chosen[h] is not None else s) for h, s in pool.items() if h in chosen}
    elif exclude:
        dropped = _parse_filter(exclude, "--exclude", pool)
        pool = {
            h: ([] if dropped[h] is None else [i for i in s if i not in dropped[h]]) if h in dropped else s
            for h, s in pool.items()
        }
        pool = {h: s for h, s in pool.items() if s}
    return [Host(h, tuple(s)) for h, s in pool.items()]


def select_hosts(
    hostfile: dict[str, int], *, num_nodes: int | None, num_gpus: int | None, include: str = "", exclude: str = ""
) -> list[Host]:
    """The hosts (in hostfile order) and slots a trial uses, as DeepSpeed's runner picks them."""
    hosts = _filtered(hostfile, include, exclude)
    if num_nodes is not None:
        if num_nodes > len(hosts):
            raise ConfigError(
                f"--num-nodes {num_nodes} is more than the {len(hosts)} host(s) left after the "
                "hostfile and filters; lower --num-nodes or add hosts"
            )
        hosts = hosts[:num_nodes]
    if num_gpus is not None:
        short = [h.name for h in hosts if len(h.slots) < num_gpus]
        if short:
            raise ConfigError(
                f"--num-gpus {num_gpus} is more than host {short[0]!r} offers; lower --num-gpus or change the hostfile"
            )
        hosts = [Host(h.name, h.slots[:num_gpus]) for h in hosts]
    counts = {len(h.slots) for h in hosts}
    if len(counts) > 1:
        raise ConfigError(
            "the selected hosts offer different numbers of slots "
            f"({', '.join(f'{h.name}: {len(h.slots)}' for h in hosts)}); give --num-gpus so every "
            "node runs the same number of processes"
        )
    return hosts
