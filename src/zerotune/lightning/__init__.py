"""zerotune's Lightning integration: ``Trainer(strategy="deepspeed_autotune")`` after
``import zerotune.lightning`` (importing registers the strategy name)."""

from lightning.pytorch.strategies import StrategyRegistry

from ._strategy import AutotuneDeepSpeedStrategy

if AutotuneDeepSpeedStrategy.strategy_name not in StrategyRegistry:
    AutotuneDeepSpeedStrategy.register_strategies(StrategyRegistry)

__all__ = ["AutotuneDeepSpeedStrategy"]
