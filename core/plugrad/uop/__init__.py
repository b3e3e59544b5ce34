"""The IR: UOp graphs, pattern rewriting, the symbolic simplifier, the spec and the PROGRAM UOp."""
from plugrad.uop.ops import AxisType, GroupOp, KernelInfo, Ops, UOp, UOpError, Variable, exec_alu, sint
from plugrad.uop.pattern import PatternMatcher, UPat, UPatError
from plugrad.uop.program import Estimates, ProgramError, ProgramStageError, ProgramUOp, make_program  # registers the PROGRAM class
from plugrad.uop.rewrite import RewriteNotConverging, graph_rewrite
from plugrad.uop.spec import SpecError

__all__ = ["AxisType", "GroupOp", "KernelInfo", "Ops", "PatternMatcher", "RewriteNotConverging", "UOp", "UOpError", "UPat", "UPatError",
           "Variable", "exec_alu", "graph_rewrite", "sint"]
__all__ += ["Estimates", "ProgramError", "ProgramStageError", "ProgramUOp", "SpecError", "make_program"]
