"""A short infix rendering of (mostly symbolic) expressions, for shapes, kernel names and error messages."""
from __future__ import annotations

from plugrad.uop.ops import Ops, UOp

_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.FDIV: "/", Ops.MOD: "%", Ops.CMPLT: "<", Ops.CMPNE: "!=",
          Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}


def render_expr(root: UOp) -> str:
  out: dict[UOp, str] = {}
  for u in root.toposort:
    s = [out[x] for x in u.src]
    if u.op is Ops.CONST: r = repr(u.arg)
    elif u.op is Ops.DEFINE_VAR: r = u.arg[0]
    elif u.op is Ops.BIND: r = s[0]
    elif u.op is Ops.SPECIAL: r = str(u.arg)
    elif u.op is Ops.RANGE: r = f"r{u.arg[0]}" if isinstance(u.arg, tuple) else f"r{u.arg}"
    elif u.op in _INFIX and len(s) == 2: r = f"({s[0]}{_INFIX[u.op]}{s[1]})"
    elif u.op is Ops.NEG: r = f"(-{s[0]})"
    elif u.op is Ops.MAX: r = f"max({s[0]}, {s[1]})"
    elif u.op is Ops.WHERE: r = f"({s[1]} if {s[0]} else {s[2]})"
    elif u.op is Ops.CAST: r = f"({u.dtype.name}){s[0]}"
    else: r = f"{u.op.name.lower()}({', '.join(s)})"
    out[u] = r
  return out[root]
