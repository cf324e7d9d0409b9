"""Code that runs inside a trial's processes: ``python -m zerotune.probe`` runs the user's script
unchanged, times its optimizer steps end to end, records memory, and ends the trial once the
estimate is stable. Nothing here is imported by the tuner process itself."""

from ._accelerate_cpu import install as install_accelerate_cpu

__all__ = ["install_accelerate_cpu"]
