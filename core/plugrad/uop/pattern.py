"""`UPat` (patterns over UOps) and `PatternMatcher` (an op-indexed list of rules, each compiled to a Python function).

Matching rules (the contract every rewrite in the compiler relies on):
- `op`, `dtype`: one value or a tuple of alternatives; `None` matches anything. A dtype matches a vector whose scalar it names.
- `arg`: compared with `==` when not None.
- `src`: a tuple matches the sources in order (exact length unless `allow_any_len`, then a prefix); a list matches any
  permutation of them; a single UPat must match every source (any count); None does not look at the sources.
- `name`: binds the matched UOp; a name used twice must bind the same UOp both times.
A rule's function gets the bound names it declares as keyword arguments (and `ctx` if it declares one) and returns
a replacement UOp or None for "no change". Every possible binding is tried until one returns non-None.
"""
from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from plugrad.dtype import DType
from plugrad.helpers import UPAT_COMPILE
from plugrad.uop.ops import GroupOp, Ops, UOp

MatchFn = Callable[[UOp, Any], Any]


class UPatError(TypeError):
  """A pattern or rule was written wrongly (caught when the PatternMatcher is built)."""


class UPat:
  __slots__ = ("op", "dtype", "arg", "name", "src", "src_kind", "allowed_len", "alts", "early_reject")

  def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
               src: UPat | tuple[UPat, ...] | list[UPat] | None = None, arg: Any = None, name: str | None = None,
               allow_any_len: bool = False):
    self.op: tuple[Ops, ...] | None = (op,) if isinstance(op, Ops) else tuple(op) if op is not None else None
    if self.op is not None and not all(isinstance(o, Ops) for o in self.op): raise UPatError(f"UPat op must be Ops, got {op!r}")
    self.dtype: tuple[DType, ...] | None = (dtype,) if isinstance(dtype, DType) else tuple(dtype) if dtype is not None else None
    self.arg, self.name = arg, name
    self.alts: tuple[UPat, ...] | None = None
    self.src: tuple[UPat, ...] | None
    self.src_kind: str | None
    if src is None: self.src_kind, self.src = None, None
    elif isinstance(src, UPat): self.src_kind, self.src = "repeat", (src,)
    elif isinstance(src, list): self.src_kind, self.src = "perm", tuple(src)
    elif isinstance(src, tuple): self.src_kind, self.src = "seq", src
    else: raise UPatError(f"UPat src must be a UPat, tuple or list, got {type(src).__name__}")
    if self.src is not None and not all(isinstance(s, UPat) for s in self.src): raise UPatError(f"UPat src entries must be UPats: {src!r}")
    if self.src_kind == "perm" and allow_any_len: raise UPatError("a permutation src (list) cannot allow_any_len")
    fixed = self.src if self.src_kind in ("seq", "perm") else None
    self.allowed_len = len(fixed) if fixed is not None and not allow_any_len else -1
    # ops that must appear among the sources: a cheap test before a full match
    self.early_reject = frozenset(s.op[0] for s in fixed if s.op is not None and len(s.op) == 1) if fixed is not None else frozenset()

  # ---- constructors
  @staticmethod
  def any(*pats: UPat, name: str | None = None) -> UPat:
    """Matches when any of `pats` matches."""
    ret = UPat(name=name)
    ret.alts = tuple(pats)
    return ret

  @staticmethod
  def var(name: str | None = None, dtype: DType | Sequence[DType] | None = None) -> UPat: return UPat(dtype=dtype, name=name)
  @staticmethod
  def cvar(name: str | None = None, dtype: DType | Sequence[DType] | None = None, vec: bool = True) -> UPat:
    return UPat((Ops.CONST, Ops.VCONST) if vec else Ops.CONST, dtype, name=name)
  @staticmethod
  def const(dtype: DType | Sequence[DType] | None, b: Any) -> UPat: return UPat(Ops.CONST, dtype, arg=b)

  def named(self, name: str) -> UPat:
    ret = UPat(self.op, self.dtype, None, self.arg, name)
    ret.src_kind, ret.src, ret.allowed_len, ret.alts, ret.early_reject = self.src_kind, self.src, self.allowed_len, self.alts, self.early_reject
    return ret

  # ---- building ALU patterns with operators (commutative ops match either source order)
  def alu(self, op: Ops, *src: Any) -> UPat:
    srcs = [self, *(s if isinstance(s, UPat) else UPat.const(None, s) for s in src)]
    return UPat(op, src=srcs if op in GroupOp.Commutative else tuple(srcs))
  def __add__(self, x: Any) -> UPat: return self.alu(Ops.ADD, x)
  def __radd__(self, x: Any) -> UPat: return self.alu(Ops.ADD, x)
  def __mul__(self, x: Any) -> UPat: return self.alu(Ops.MUL, x)
  def __rmul__(self, x: Any) -> UPat: return self.alu(Ops.MUL, x)
  def __floordiv__(self, x: Any) -> UPat: return self.alu(Ops.IDIV, x)
  def __truediv__(self, x: Any) -> UPat: return self.alu(Ops.FDIV, x)
  def __mod__(self, x: Any) -> UPat: return self.alu(Ops.MOD, x)
  def __sub__(self, x: Any) -> UPat: return self.alu(Ops.SUB, x)
  def __lt__(self, x: Any) -> UPat: return self.alu(Ops.CMPLT, x)
  def __and__(self, x: Any) -> UPat: return self.alu(Ops.AND, x)
  def __or__(self, x: Any) -> UPat: return self.alu(Ops.OR, x)
  def __xor__(self, x: Any) -> UPat: return self.alu(Ops.XOR, x)
  def __lshift__(self, x: Any) -> UPat: return self.alu(Ops.SHL, x)
  def __rshift__(self, x: Any) -> UPat: return self.alu(Ops.SHR, x)
  def ne(self, x: Any) -> UPat: return self.alu(Ops.CMPNE, x)
  def eq(self, x: Any) -> UPat: return self.alu(Ops.CMPEQ, x)
  def maximum(self, x: Any) -> UPat: return self.alu(Ops.MAX, x)
  def where(self, t: Any, f: Any) -> UPat: return self.alu(Ops.WHERE, t, f)
  def cast(self, dtype: DType | None = None) -> UPat: return UPat(Ops.CAST, dtype, (self,))
  def logical_not(self) -> UPat: return self.ne(True)
  __hash__ = object.__hash__

  def __repr__(self) -> str:
    if self.alts is not None: return f"UPat.any({', '.join(map(repr, self.alts))})"
    parts = [repr(self.op[0] if self.op and len(self.op) == 1 else self.op)]
    if self.dtype is not None: parts.append(f"dtype={self.dtype!r}")
    if self.arg is not None: parts.append(f"arg={self.arg!r}")
    if self.name is not None: parts.append(f"name={self.name!r}")
    if self.src is not None:
      parts.append(f"src={self.src[0] if self.src_kind == 'repeat' else list(self.src) if self.src_kind == 'perm' else self.src!r}")
    return f"UPat({', '.join(parts)})"

  # ---- the interpreted matcher: every binding of names that makes the pattern match
  def match(self, uop: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
    if self.alts is not None:
      out = []
      for p in self.alts:
        s = dict(store)
        if self.name is not None and s.setdefault(self.name, uop) is not uop: continue
        out.extend(p.match(uop, s))
      return out
    if (self.op is not None and uop.op not in self.op) or \
       (self.dtype is not None and uop.dtype not in self.dtype and uop.dtype.scalar() not in self.dtype) or \
       (self.arg is not None and self.arg != uop.arg) or \
       (self.allowed_len != -1 and len(uop.src) != self.allowed_len) or \
       (self.src_kind in ("seq", "perm") and len(uop.src) < len(self.src)):  # type: ignore[arg-type]
      return []
    if self.name is not None:
      if (bound := store.get(self.name)) is None: store = {**store, self.name: uop}
      elif bound is not uop: return []
    if self.src is None: return [store]
    out = []
    for variant in self._src_variants(uop):
      stores = [store]
      for pat, u in zip(variant, uop.src):
        stores = [r for s in stores for r in pat.match(u, s)]
        if not stores: break
      out.extend(stores)
    return out

  def _src_variants(self, uop: UOp) -> Iterator[tuple[UPat, ...]]:
    assert self.src is not None
    if self.src_kind == "seq": yield self.src
    elif self.src_kind == "repeat": yield self.src * len(uop.src)
    else: yield from itertools.permutations(self.src)

  def names(self) -> set[str]:
    out = {self.name} if self.name is not None else set()
    for p in (self.alts or ()) + (self.src or ()): out |= p.names()
    return out


def expand_alternatives(pat: UPat) -> list[UPat]:
  """Rewrite a pattern containing `UPat.any` into the list of plain patterns it stands for."""
  if pat.alts is not None:
    out = []
    for alt in pat.alts:
      for a in expand_alternatives(alt):
        if pat.name is None: out.append(a)
        elif a.name is None or a.name == pat.name: out.append(a.named(pat.name))
        else: out.append(UPat.any(a, name=pat.name))  # two names on one node: leave to the interpreter
    return out
  if pat.src is None: return [pat]
  out = []
  for combo in itertools.product(*(expand_alternatives(s) for s in pat.src)):
    p = UPat(pat.op, pat.dtype, list(combo) if pat.src_kind == "perm" else combo[0] if pat.src_kind == "repeat" else tuple(combo),
             pat.arg, pat.name, allow_any_len=pat.allowed_len == -1 and pat.src_kind == "seq")
    out.append(p)
  return out


# ---- compiling a pattern to straight-line Python

def _compilable(p: UPat) -> bool:
  if p.alts is not None or p.src_kind == "repeat": return False
  return all(_compilable(s) for s in (p.src or ()))


def _compile_rule(pat: UPat, call: Callable[..., Any], kwnames: list[str], wants_ctx: bool) -> MatchFn:
  consts: dict[str, Any] = {"_call": call}
  lines: list[str] = []
  bound: dict[str, str] = {}
  counter = itertools.count(1)
  depth = [1]  # indentation level
  loops = [0]

  def emit(s: str) -> None: lines.append("  " * depth[0] + s)
  def fail() -> str: return "continue" if loops[0] else "return None"
  def const(v: Any) -> str:
    k = f"_c{len(consts)}"
    consts[k] = v
    return k

  def gen(p: UPat, var: str) -> None:
    if p.op is not None:
      emit(f"if {var}.op is not {const(p.op[0])}: {fail()}" if len(p.op) == 1 else f"if {var}.op not in {const(frozenset(p.op))}: {fail()}")
    if p.dtype is not None:
      dts = const(frozenset(p.dtype))
      emit(f"if {var}.dtype not in {dts} and {var}.dtype.scalar() not in {dts}: {fail()}")
    if p.arg is not None: emit(f"if {var}.arg != {const(p.arg)}: {fail()}")
    if p.name is not None:
      if p.name in bound: emit(f"if {var} is not {bound[p.name]}: {fail()}")
      else: bound[p.name] = var
    if p.src is None: return
    n = len(p.src)
    emit(f"if len({var}.src) {'<' if p.allowed_len == -1 else '!='} {n}: {fail()}")
    names = [f"s{next(counter)}" for _ in range(n)]
    if p.src_kind == "seq" or n == 1:
      for i, nm in enumerate(names): emit(f"{nm} = {var}.src[{i}]")
    else:
      perms = ", ".join("(" + ", ".join(f"{var}.src[{i}]" for i in perm) + ",)" for perm in itertools.permutations(range(n)))
      emit(f"for {', '.join(names)}, in ({perms}):")
      depth[0] += 1
      loops[0] += 1
    for sp, nm in zip(p.src, names): gen(sp, nm)

  gen(pat, "u")
  args = [f"{k}={bound[k]}" for k in kwnames] + (["ctx=ctx"] if wants_ctx else [])
  emit(f"r = _call({', '.join(args)})")
  emit("if r is not None: return r")
  body = "\n".join(lines)
  src = f"def match(u, ctx):\n{body}\n  return None\n"
  ns = dict(consts)
  exec(compile(src, f"<upat {pat!r}>"[:200], "exec"), ns)
  fn = ns["match"]
  fn.__source__ = src
  return fn


def _interpret_rule(pat: UPat, call: Callable[..., Any], kwnames: list[str], wants_ctx: bool) -> MatchFn:
  early = pat.early_reject

  def match(u: UOp, ctx: Any) -> Any:
    if early and not early <= {s.op for s in u.src}: return None
    for store in pat.match(u, {}):
      kw = {k: store[k] for k in kwnames}
      if (r := call(**kw, ctx=ctx) if wants_ctx else call(**kw)) is not None: return r
    return None
  return match


class Rule:
  """One (pattern, function) pair with what is needed to call it and to name it in errors."""
  __slots__ = ("pat", "fxn", "kwnames", "wants_ctx", "location")

  def __init__(self, pat: UPat, fxn: Callable[..., Any]):
    if not isinstance(pat, UPat): raise UPatError(f"a rule must start with a UPat, got {type(pat).__name__}")
    if not callable(fxn): raise UPatError(f"the rule for {pat!r} needs a callable, got {type(fxn).__name__}")
    self.pat, self.fxn = pat, fxn
    params = inspect.signature(fxn).parameters
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    names = pat.names()
    self.wants_ctx = "ctx" in params or var_kw
    self.kwnames = sorted(names if var_kw else names & set(params))
    missing = [k for k, p in params.items() if k != "ctx" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.default is p.empty
               and k not in names]
    code = getattr(fxn, "__code__", None)
    self.location = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else repr(fxn)
    if missing: raise UPatError(f"rule at {self.location} takes {missing}, which its pattern never names (names: {sorted(names)})")

  def __repr__(self) -> str: return f"<rule {self.pat!r} at {self.location}>"


class PatternMatcher:
  """An ordered list of rules, indexed by the op of the root pattern. `pm.rewrite(uop, ctx)` applies the first rule that
  returns a replacement. Matchers compose with `+` (rules of the left one first)."""

  def __init__(self, patterns: Sequence[tuple[UPat, Callable[..., Any]]], compiled: bool | None = None):
    self.patterns = list(patterns)
    self.compiled = bool(UPAT_COMPILE) if compiled is None else compiled
    self.rules = [Rule(p, f) for p, f in self.patterns]
    self.pdict: dict[Ops, list[tuple[MatchFn, Rule]]] = {}
    for rule in self.rules:
      for pat in expand_alternatives(rule.pat) if self.compiled else [rule.pat]:
        if self.compiled and _compilable(pat): fn = _compile_rule(pat, rule.fxn, rule.kwnames, rule.wants_ctx)
        else: fn = _interpret_rule(pat, rule.fxn, rule.kwnames, rule.wants_ctx)
        for op in pat.op if pat.op is not None else tuple(Ops):
          self.pdict.setdefault(op, []).append((fn, rule))
    self.fast: dict[Ops, tuple[MatchFn, ...]] = {op: tuple(fn for fn, _ in v) for op, v in self.pdict.items()}

  def __add__(self, other: PatternMatcher) -> PatternMatcher: return PatternMatcher(self.patterns + other.patterns, self.compiled)
  def __len__(self) -> int: return len(self.patterns)
  # by content, not by address: a renderer's `extra_matcher` is part of the program store's key (codegen.store_key)
  def __repr__(self) -> str: return f"PatternMatcher([{', '.join(map(repr, self.rules))}])"
  def interpreted(self) -> PatternMatcher: return PatternMatcher(self.patterns, compiled=False)

  def rewrite(self, uop: UOp, ctx: Any = None) -> UOp | None:
    for fn in self.fast.get(uop.op, ()):
      if (r := fn(uop, ctx)) is not None: return r
    return None

  def firing_rule(self, uop: UOp, ctx: Any = None) -> Rule | None:
    """The rule `rewrite` would apply to `uop` (for error messages)."""
    for fn, rule in self.pdict.get(uop.op, ()):
      if fn(uop, ctx) is not None: return rule
    return None
