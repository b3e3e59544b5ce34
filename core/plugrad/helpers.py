"""Environment flags, `Context` overrides and small utilities shared by every layer."""
from __future__ import annotations

import contextlib
import functools
import math
import os
import pathlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class SettingsError(ValueError):
  """An environment variable holds a value plugrad cannot use; the message names the variable, the value and what is
  allowed. Raised when the setting is first read (a flag read at import: at `import plugrad`)."""


class _Unset:  # Context's marker of a flag whose environment value was bad
  pass


def parse_setting(key: str, raw: str | None, default: Any, choices: Sequence[Any] | None = None,
                  minimum: float | None = None, maximum: float | None = None) -> Any:
  """`raw` (an environment variable's text; None or blank: `default`) converted to the type of `default` (int, float
  or str) and checked against `choices` or [`minimum`, `maximum`]; anything else raises SettingsError."""
  if raw is None or not raw.strip(): return default
  kind, text = type(default), raw.strip()
  if choices is not None: allowed = "one of " + ", ".join(str(c) for c in choices)
  elif kind in (int, float):
    allowed = ("an integer" if kind is int else "a number") + (f" >= {minimum}" if minimum is not None else "") + \
      (f" <= {maximum}" if maximum is not None else "")
  else: allowed = f"a {kind.__name__}"
  bad = SettingsError(f"{key}={raw!r} is not valid: expected {allowed} (docs/env-vars.md)")
  try: val = kind(text)
  except ValueError: raise bad from None
  if (choices is not None and val not in choices) or (minimum is not None and val < minimum) or (maximum is not None and val > maximum): raise bad
  return val


class ContextVar:
  """An integer (or string) flag read from the environment at its first use, overridable with `Context(...)`. Read
  lazily so that a program or a test's conftest may set it after `import plugrad` (pytest imports plugrad for its
  conformance plugin before any conftest runs); a bad value raises SettingsError at each read. Once read, the `value`
  slot holds it, so reading a flag costs no more than an attribute."""
  _registry: dict[str, ContextVar] = {}
  __slots__ = ("key", "value", "default", "choices", "minimum")

  def __init__(self, key: str, default: Any, choices: Sequence[Any] | None = None, minimum: float | None = None):
    self.key, self.default, self.choices, self.minimum = key, default, choices, minimum
    ContextVar._registry[key] = self

  def __getattr__(self, name: str) -> Any:  # only reached while `value` is unset: the first read
    if name != "value": raise AttributeError(name)
    self.value = parse_setting(self.key, os.environ.get(self.key), self.default, self.choices, self.minimum)
    return self.value

  def __bool__(self) -> bool: return bool(self.value)
  def __ge__(self, x: Any) -> bool: return self.value >= x
  def __gt__(self, x: Any) -> bool: return self.value > x
  def __le__(self, x: Any) -> bool: return self.value <= x
  def __lt__(self, x: Any) -> bool: return self.value < x
  def __eq__(self, x: object) -> bool: return self.value == x
  def __hash__(self) -> int: return hash(self.key)
  def __repr__(self) -> str:
    try: return f"ContextVar({self.key}={self.value!r})"
    except SettingsError: return f"ContextVar({self.key}=<invalid>)"


class Context(contextlib.ContextDecorator):
  """Temporarily override flags: `with Context(DEBUG=2, SPEC=1): ...`."""
  def __init__(self, **kwargs: Any):
    unknown = [k for k in kwargs if k not in ContextVar._registry]
    if unknown: raise KeyError(f"unknown Context flag(s) {unknown}; known: {sorted(ContextVar._registry)}")
    self.kwargs = kwargs

  def __enter__(self) -> Context:
    reg = ContextVar._registry
    self.old = {}
    for k, v in self.kwargs.items():
      # a flag whose environment value was bad may still be overridden; it is bad again after the block
      try: self.old[k] = reg[k].value
      except SettingsError: self.old[k] = _Unset
      reg[k].value = v
    return self

  def __exit__(self, *exc: Any) -> None:
    for k, v in self.old.items():
      if v is _Unset: del ContextVar._registry[k].value
      else: ContextVar._registry[k].value = v


def getenv(key: str, default: Any = 0, choices: Sequence[Any] | None = None, minimum: float | None = None,
           maximum: float | None = None) -> Any:
  """Read an environment variable converted to the type of `default` (int, float or str; unset or blank: `default`)
  and checked against `choices` or [`minimum`, `maximum`]: a bad value raises SettingsError naming the variable. Not
  cached: for rarely read settings."""
  return parse_setting(key, os.environ.get(key), default, choices, minimum, maximum)


BOOL = (0, 1)  # the choices of an on/off flag
DEBUG, SPEC = ContextVar("DEBUG", 0, minimum=0), ContextVar("SPEC", 0, BOOL)
REWRITE_STEPS = ContextVar("REWRITE_STEPS", 100_000, minimum=1)  # budget of rule applications per graph_rewrite
UPAT_COMPILE = ContextVar("UPAT_COMPILE", 1, BOOL)               # 0 = use the interpreted matcher everywhere
CACHE = ContextVar("CACHE", 1, BOOL)


def cache_dir() -> pathlib.Path:
  """Where plugrad keeps on-disk caches: $PLUGRAD_CACHE_DIR, else the user cache dir."""
  if (d := os.environ.get("PLUGRAD_CACHE_DIR")): return pathlib.Path(d)
  if sys.platform == "darwin": base = pathlib.Path.home() / "Library" / "Caches"
  else: base = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
  return base / "plugrad"


def prod(xs: Iterable[Any], start: Any = 1) -> Any: return functools.reduce(lambda a, b: a * b, xs, start)
def flatten(xss: Iterable[Iterable[T]]) -> list[T]: return [x for xs in xss for x in xs]
def dedup(xs: Iterable[T]) -> list[T]: return list(dict.fromkeys(xs))
def all_same(xs: Sequence[Any]) -> bool: return all(x == xs[0] for x in xs[1:])
def all_int(xs: Iterable[Any]) -> bool: return all(isinstance(x, int) and not isinstance(x, bool) for x in xs)
def argsort(xs: Sequence[Any]) -> list[int]: return sorted(range(len(xs)), key=xs.__getitem__)
def ceildiv(a: Any, b: Any) -> Any:
  """ceil(a / b) for b > 0. Symbolic sizes (a >= 0) take the form whose division truncates, as a UOp's // does."""
  return -(a // -b) if isinstance(a, int) and isinstance(b, int) else (a + (b - 1)) // b
def round_up(x: int, multiple: int) -> int: return ceildiv(x, multiple) * multiple
def is_pow2(x: int) -> bool: return x > 0 and (x & (x - 1)) == 0


def partition(xs: Iterable[T], pred: Any) -> tuple[list[T], list[T]]:
  yes: list[T] = []
  no: list[T] = []
  for x in xs: (yes if pred(x) else no).append(x)
  return yes, no


def cdiv(a: int, b: int) -> int:
  """C-style integer division (truncates toward zero), the semantics of Ops.IDIV."""
  q = abs(a) // abs(b)
  return q if (a < 0) == (b < 0) else -q


def cmod(a: int, b: int) -> int:
  """C-style remainder (sign of the dividend), the semantics of Ops.MOD."""
  return a - b * cdiv(a, b)


def to_float_str(x: float) -> str:
  return "inf" if x == math.inf else "-inf" if x == -math.inf else "nan" if math.isnan(x) else repr(x)


@contextlib.contextmanager
def recursion_limit(n: int) -> Iterator[None]:
  old = sys.getrecursionlimit()
  sys.setrecursionlimit(max(old, n))
  try: yield
  finally: sys.setrecursionlimit(old)


# How many distinct kernels a process keeps rendered and loaded (codegen's program cache, the engine's runners): past
# it the least recently used are dropped, so that a long run with ever new shapes keeps its memory maps bounded.
MAX_LOADED_KERNELS = ContextVar("MAX_LOADED_KERNELS", 4096, minimum=1)
_K = TypeVar("_K")
_V = TypeVar("_V")


class LRUCache(dict[_K, _V]):
  """A dict of at most `cap.value` entries, dropping the least recently used on insert (`get` and `[]` count as a
  use). A dropped value lives on while anything else holds it (a TinyJit's captured runner keeps its code)."""
  def __init__(self, cap: ContextVar) -> None:
    super().__init__()
    self._cap, self._lock = cap, __import__("threading").Lock()

  def get(self, key: _K, default: Any = None) -> Any:
    with self._lock:
      if (v := dict.pop(self, key, _MISSING)) is _MISSING: return default
      dict.__setitem__(self, key, v)  # re-inserted: dicts keep insertion order, so the first key is the least recent
      return v

  def __getitem__(self, key: _K) -> _V:
    if (v := self.get(key, _MISSING)) is _MISSING: raise KeyError(key)
    return v

  def __setitem__(self, key: _K, value: _V) -> None:
    with self._lock:
      dict.pop(self, key, None)
      dict.__setitem__(self, key, value)
      while len(self) > max(1, int(self._cap.value)): dict.pop(self, next(iter(self)))


_MISSING: Any = object()
