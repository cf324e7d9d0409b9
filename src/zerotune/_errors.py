"""One exception root; the CLI turns any of these into one message and exit status 2."""


class ZerotuneError(Exception):
    """Base of every error zerotune raises on purpose. ``str(err)`` is the whole user message."""


class ConfigError(ZerotuneError, ValueError):
    """The ds_config, its ``autotuning`` section or a command-line option is invalid."""


class LaunchError(ZerotuneError):
    """A trial could not be started at all (missing script, missing launcher tool, bad host)."""


class NoFeasibleConfigError(ZerotuneError):
    """Every candidate configuration failed, ran out of memory or was pruned."""
