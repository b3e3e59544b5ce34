"""The kernel optimizer: actions (`Opt`), the `Scheduler` that applies them, the hand-coded heuristics and BEAM search.
See docs/optimizer.md."""
from __future__ import annotations

from plugrad.codegen.opt.heuristic import hand_coded_optimizations
from plugrad.codegen.opt.kernel import MAX_UPCAST, KernelOptError, Opt, OptOps, Scheduler
from plugrad.helpers import ContextVar

BEAM = ContextVar("BEAM", 0, minimum=0)    # BEAM=n: search the actions, keeping the n fastest candidates per step
NOOPT = ContextVar("NOOPT", 0, (0, 1))  # NOOPT=1: apply no actions at all (heuristics off)

__all__ = ["BEAM", "MAX_UPCAST", "NOOPT", "KernelOptError", "Opt", "OptOps", "Scheduler", "hand_coded_optimizations"]
