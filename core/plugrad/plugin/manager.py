"""The plugin manager: finds backends through entry points (group `plugrad`), loads each one in isolation, checks
its plugin API version, detects device-name conflicts and calls the component hooks on behalf of the registry.

Nothing here runs at `import plugrad`: entry points are read on the first device use (`PluginManager.load`). A plugin
that fails is recorded with its distribution, version and traceback and skipped, so one broken backend never breaks
the core or the other devices; asking for a device it would have provided re-raises the recorded cause with a remedy.
The same holds after loading: a probe or device count that raises, or a component hook that raises or returns the wrong
type for a device its plugin does not declare, takes away only what that plugin provides (docs/security.md, "Devices").
A plugin's import, its `plugrad_devices()` and its probes and counts run under a deadline (PLUGRAD_PROBE_TIMEOUT), in a
worker thread, so that one that never answers makes only its own devices unavailable.
"""
from __future__ import annotations

import contextvars
import difflib
import functools
import importlib
import importlib.metadata
import os
import re
import threading
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pluggy

from plugrad.errors import (
  DeviceError,
  PluginAPIVersionError,
  PluginConflictError,
  PluginHookError,
  PluginLoadError,
  PluginTimeoutError,
  UnknownDeviceError,
)
from plugrad.helpers import SettingsError
from plugrad.plugin import hookspecs
from plugrad.plugin.hookspecs import API_VERSION, PROJECT_NAME, DeviceSpec, device_name

ENTRY_POINT_GROUP = "plugrad"
# Devices whose plugin we publish: an unknown name among these gets an exact install command.
FIRST_PARTY: dict[str, str] = {"CPU": "plugrad-cpu", "CUDA": "plugrad-cuda", "AMD": "plugrad-amd", "METAL": "plugrad-metal",
                               "WEBGPU": "plugrad-webgpu"}
ErrorFactory = Callable[[], DeviceError]
# Seconds a plugin's import, plugrad_devices(), probe or count may take: the slowest real one here (a WebGPU adapter on a
# software rasterizer) takes ~2 s on a loaded machine, so this only ever catches a plugin that hangs.
DEFAULT_PROBE_TIMEOUT = 10.0


class PluginWarning(UserWarning):
  """A plugin failed and was skipped (only when PLUGRAD_STRICT_PLUGINS is not set; otherwise that is an error)."""


class DeviceFallbackWarning(PluginWarning):
  """The default device fell back past a device that failed, conflicts or is misconfigured (or past every fast device
  to the reference interpreter); an error (`DeviceFallbackError`) under PLUGRAD_STRICT_PLUGINS=1."""


class EntryPointLike(Protocol):
  """What the manager needs of an `importlib.metadata.EntryPoint` (`dist` may be absent or None)."""
  name: str
  value: str
  def load(self) -> Any: ...


def normalize_dist(name: str) -> str:
  """PEP 503 normalization, so that `plugrad_foo`, `Plugrad.Foo` and `plugrad-foo` compare equal."""
  return re.sub(r"[-_.]+", "-", name).lower()


def core_version() -> str:
  try: return importlib.metadata.version("plugrad")
  except importlib.metadata.PackageNotFoundError: return "unknown (not installed)"


def _env_flag(env: Mapping[str, str], key: str) -> bool:
  raw = env.get(key, "").strip()
  if raw in ("", "0"): return False
  if raw == "1": return True
  raise SettingsError(f"{key} must be 0 or 1, got {raw!r} (see docs/env-vars.md)")


def _env_seconds(env: Mapping[str, str], key: str, default: float) -> float:
  raw = env.get(key, "").strip()
  if raw == "": return default
  try: v = float(raw)
  except ValueError: v = -1.0
  if not v >= 0 or v == float("inf"):
    raise SettingsError(f"{key} must be a number of seconds >= 0 (0: no deadline), got {raw!r} (see docs/env-vars.md)")
  return v


def _installed_entry_points() -> list[EntryPointLike]: return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


@dataclass
class PluginRecord:
  """One plugin as the manager sees it. `status` is "active", "conflict" (active, but a device name or alias it declares
  is claimed by another plugin too: that name is unusable, its other devices work), "failed" or "blocked"; `reason`
  says why for the last three."""
  name: str                      # the entry point name ("builtin" for PYTHON and NULL)
  distribution: str
  version: str
  module: str                    # what the entry point points at
  builtin: bool = False
  status: str = "pending"
  reason: str = ""
  traceback: str = ""
  specs: tuple[DeviceSpec, ...] = ()
  error: BaseException | None = field(default=None, repr=False)
  error_type: type[DeviceError] = field(default=PluginLoadError, repr=False)
  remedy: str = ""
  hung: str = ""                 # set when one of its probes or counts did not answer: every device of it is unavailable

  @property
  def label(self) -> str: return f"{self.distribution} {self.version}"
  @property
  def devices(self) -> tuple[str, ...]: return tuple(s.name for s in self.specs)
  @property
  def api(self) -> str: return ", ".join(dict.fromkeys(s.api_str for s in self.specs)) or "-"
  @property
  def status_text(self) -> str: return f"{self.status}: {self.reason}" if self.status in ("failed", "conflict") else self.status

  def exception(self, device: str | None = None) -> DeviceError:
    """A fresh error for a failed plugin (raised each time the device is asked for), chained to the recorded cause."""
    what = f"device {device!r} is unavailable: " if device else ""
    verb = "was refused" if issubclass(self.error_type, PluginAPIVersionError) else \
      "timed out" if issubclass(self.error_type, PluginTimeoutError) else "failed to load"
    err = self.error_type(f"{what}plugin {self.name!r} ({self.label}) {verb}: {self.reason}" + (f"\n{self.remedy}" if self.remedy else ""))
    err.__cause__ = self.error
    return err

  def as_dict(self) -> dict[str, Any]:
    return {"name": self.name, "distribution": self.distribution, "version": self.version, "module": self.module, "api": self.api,
            "status": self.status_text, "reason": self.reason or None, "devices": list(self.devices), "builtin": self.builtin,
            "traceback": self.traceback or None}


@dataclass(frozen=True)
class DeviceEntry:
  """A device that is declared by exactly one active plugin."""
  spec: DeviceSpec
  plugin: PluginRecord


class PluginManager:
  """Loads the plugins once, lazily, and answers questions about devices.

  `entry_points` replaces the installed entry points (tests give fake ones), `builtins=False` leaves out PYTHON and NULL,
  and `env` replaces `os.environ` for the PLUGRAD_* settings and DEV (read on first use, not at construction)."""

  def __init__(self, entry_points: Callable[[], Iterable[EntryPointLike]] | None = None, *, builtins: bool = True,
               env: Mapping[str, str] | None = None):
    self._entry_points = entry_points if entry_points is not None else _installed_entry_points
    self._builtins, self._env = builtins, env
    self._pm = pluggy.PluginManager(PROJECT_NAME)
    self._pm.add_hookspecs(hookspecs)
    self._records: list[PluginRecord] = []
    self._by_regname: dict[str, PluginRecord] = {}
    self._devices: dict[str, DeviceEntry] = {}
    self._aliases: dict[str, str] = {}
    self._errors: dict[str, ErrorFactory] = {}   # a declared name or alias that cannot be used, and why
    self._conflicts: dict[str, list[tuple[DeviceSpec, PluginRecord]]] = {}  # a name claimed more than once: the claims
    self._known: set[str] = set()                # every declared device name (usable or not), aliases excluded
    self._probes: dict[str, Probed] = {}
    self._skipped_hooks: set[tuple[str, str]] = set()  # (plugin, hook) already warned about raising for a foreign device
    self._fatal: ErrorFactory | None = None
    self._loaded = False
    self._lock = threading.RLock()

  # ---- settings
  @property
  def env(self) -> Mapping[str, str]: return os.environ if self._env is None else self._env
  @property
  def strict(self) -> bool: return _env_flag(self.env, "PLUGRAD_STRICT_PLUGINS")
  @property
  def no_plugins(self) -> bool: return _env_flag(self.env, "PLUGRAD_NO_PLUGINS")
  @property
  def probe_timeout(self) -> float: return _env_seconds(self.env, "PLUGRAD_PROBE_TIMEOUT", DEFAULT_PROBE_TIMEOUT)
  @property
  def allowlist(self) -> tuple[str, ...] | None:
    raw = self.env.get("PLUGRAD_PLUGINS", "")
    names = tuple(normalize_dist(n.strip()) for n in raw.split(",") if n.strip())
    return names or None

  @property
  def loaded(self) -> bool: return self._loaded

  # ---- loading
  def load(self) -> None:
    """Read the entry points and register every plugin (once; later calls only re-raise a strict-mode failure)."""
    with self._lock:
      if not self._loaded:
        strict, no_plugins, allow, _ = self.strict, self.no_plugins, self.allowlist, self.probe_timeout  # bad values raise first
        self._loaded = True
        if self._builtins and (mod := _builtin_plugin[0]) is not None:
          self._add(mod(), PluginRecord("builtin", "plugrad", core_version(), "plugrad.builtin.plugin", builtin=True))
        try: eps = sorted(self._entry_points(), key=lambda e: (_dist_of(e)[0], e.name))
        except Exception as e:  # a corrupt installation: report it, keep the built-ins usable
          eps = []
          rec = PluginRecord("<entry points>", "<environment>", "-", ENTRY_POINT_GROUP)
          self._records.append(rec)
          self._fail(rec, e, f"reading the {ENTRY_POINT_GROUP!r} entry points failed: {type(e).__name__}: {e}",
                     "Check the Python environment (pip check); a broken distribution's metadata can cause this.")
        for ep in eps: self._load_entry_point(ep, no_plugins, allow)
        if allow is not None:
          seen = {r.name.lower() for r in self._records} | {normalize_dist(r.distribution) for r in self._records} | {"builtin", "plugrad"}
          if (missing := [a for a in allow if a not in seen]):
            warnings.warn(f"PLUGRAD_PLUGINS names {missing}, which match no installed plugin (entry point or distribution name)",
                          PluginWarning, stacklevel=3)
        self._rebuild()
        if strict: self._fatal = self._strict_failure()
      if self._fatal is not None: raise self._fatal()

  def register(self, plugin: object, name: str, distribution: str = "", version: str = "") -> PluginRecord:
    """Register a plugin object directly, without an entry point (for embedding applications and tests). It goes through
    the same checks as an installed plugin; the returned record says whether it is active."""
    with self._lock:
      self.load()
      rec = PluginRecord(name, distribution or name, version or "unknown", getattr(plugin, "__name__", type(plugin).__name__))
      self._add(plugin, rec)
      self._rebuild()
      if self.strict and (fatal := self._strict_failure()) is not None: raise fatal()
      return rec

  def _load_entry_point(self, ep: EntryPointLike, no_plugins: bool, allow: tuple[str, ...] | None) -> None:
    dist, version = _dist_of(ep)
    rec = PluginRecord(ep.name, dist, version, ep.value)
    if no_plugins: rec.status, rec.reason = "blocked", "PLUGRAD_NO_PLUGINS=1 loads only the built-in devices"
    elif allow is not None and ep.name.lower() not in allow and normalize_dist(dist) not in allow:
      rec.status, rec.reason = "blocked", f"not in PLUGRAD_PLUGINS={','.join(allow)}"
    if rec.status == "blocked":
      self._records.append(rec)
      return
    obj, e = _call_plugin(ep.load, self.probe_timeout)  # SystemExit from a plugin's import must not end the process
    if isinstance(e, _Hung):
      self._records.append(rec)
      self._fail(rec, e, f"importing {ep.value!r} did not answer in {e.seconds:g} s (PLUGRAD_PROBE_TIMEOUT)", _hung_remedy(rec), PluginTimeoutError)
      return
    if e is not None:
      self._records.append(rec)
      self._fail(rec, e, f"importing {ep.value!r} raised {type(e).__name__}: {e}", _reinstall_remedy(rec))
      return
    self._add(obj, rec)

  def _add(self, obj: object, rec: PluginRecord) -> None:
    self._records.append(rec)
    regname = f"{rec.distribution}:{rec.name}:{len(self._records)}"
    try: self._pm.register(obj, name=regname)
    except Exception as e:
      return self._fail(rec, e, f"cannot be registered: {type(e).__name__}: {e}", _fix_remedy(rec))
    self._by_regname[regname] = rec
    try: specs = self._read_specs(obj, rec)
    except PluginAPIVersionError as e:  # the message already says what to upgrade
      self._pm.unregister(obj)
      return self._fail(rec, e, str(e), "", PluginAPIVersionError)
    except PluginTimeoutError as e:
      self._pm.unregister(obj)
      return self._fail(rec, e, str(e), _hung_remedy(rec), PluginTimeoutError)
    except Exception as e:
      self._pm.unregister(obj)
      return self._fail(rec, e, str(e) if isinstance(e, DeviceError) else f"{type(e).__name__}: {e}", _fix_remedy(rec))
    rec.status, rec.specs = "active", specs

  def _read_specs(self, obj: object, rec: PluginRecord) -> tuple[DeviceSpec, ...]:
    callers = self._pm.get_hookcallers(obj) or []
    if not callers:
      raise PluginHookError(f"module {rec.module!r} defines no hook implementations; decorate them with plugrad.plugin.hookimpl")
    known = [n for n in dir(hookspecs) if n.startswith("plugrad_")]
    for hc in callers:
      if hc.spec is None: raise PluginHookError(f"unknown hook {hc.name!r} (a typo?); the hooks are {', '.join(known)}")
      for impl in hc.get_hookimpls():
        if impl.plugin is obj and (impl.hookwrapper or impl.wrapper):
          raise PluginHookError(f"{hc.name} is a hook wrapper; plugrad hooks return records and objects, wrappers are not supported")
    specs: list[DeviceSpec] = []
    for impl in self._pm.hook.plugrad_devices.get_hookimpls():
      if impl.plugin is not obj: continue
      ret, e = _call_plugin(impl.function, self.probe_timeout)
      if isinstance(e, _Hung): raise PluginTimeoutError(f"plugrad_devices() did not answer in {e.seconds:g} s (PLUGRAD_PROBE_TIMEOUT)") from e
      if e is not None: raise PluginHookError(f"plugrad_devices() raised {type(e).__name__}: {e}") from e
      if not isinstance(ret, (list, tuple)) or not all(isinstance(s, DeviceSpec) for s in ret):
        raise PluginHookError(f"plugrad_devices() must return a list of plugrad.plugin.DeviceSpec, got {_describe(ret)}")
      specs.extend(ret)
    rec.specs = tuple(specs)  # kept on refusal too, so that asking for these devices names the real cause
    for s in specs: _check_api(s, rec)
    return rec.specs

  def _fail(self, rec: PluginRecord, exc: BaseException, reason: str, remedy: str, error_type: type[DeviceError] | None = None) -> None:
    rec.status, rec.reason, rec.error, rec.remedy = "failed", reason, exc, remedy
    rec.error_type = error_type or PluginLoadError
    rec.traceback = "".join(traceback.format_exception(exc))
    if not self.strict: warnings.warn(f"plugrad: plugin {rec.name!r} ({rec.label}) failed and was skipped: {reason}", PluginWarning, stacklevel=4)

  def _rebuild(self) -> None:
    claims: dict[str, list[tuple[DeviceSpec, PluginRecord]]] = {}
    for rec in self._records:
      if rec.status == "conflict": rec.status, rec.reason = "active", ""  # recomputed below
      if rec.status != "active": continue
      for s in rec.specs:
        for key in (s.name, *s.aliases): claims.setdefault(key, []).append((s, rec))
    self._devices, self._aliases, self._errors, self._conflicts = {}, {}, {}, {}
    for key, cl in claims.items():
      if len(cl) > 1: self._errors[key], self._conflicts[key] = _conflict(key, cl), cl
      elif cl[0][0].name == key: self._devices[key] = DeviceEntry(*cl[0])
      else: self._aliases[key] = cl[0][0].name
    for key, cl in self._conflicts.items():
      for rec in {id(r): r for _, r in cl}.values():
        others = ", ".join(dict.fromkeys(r.label for _, r in cl if r is not rec)) or "itself (declared twice)"
        why = f"device name {key!r} is also claimed by {others}"
        rec.status, rec.reason = "conflict", f"{rec.reason}; {why}" if rec.reason else why
    for rec in self._records:  # devices of plugins refused after declaring them (API version): name the cause
      if rec.status != "failed": continue
      for s in rec.specs:
        for key in (s.name, *s.aliases): self._errors.setdefault(key, functools.partial(rec.exception, key))
    self._known = {s.name for r in self._records if r.status in ("active", "conflict", "failed") for s in r.specs}
    self._probes.clear()

  def _strict_failure(self) -> ErrorFactory | None:
    problems: list[ErrorFactory] = [r.exception for r in self._records if r.status == "failed"] + [self._errors[k] for k in self._conflicts]
    if not problems: return None
    if len(problems) == 1: return problems[0]
    text = "\n".join(f"- {p()}" for p in problems)
    return lambda: PluginLoadError(f"PLUGRAD_STRICT_PLUGINS=1 and {len(problems)} plugin problems:\n{text}")

  # ---- queries
  def records(self) -> list[PluginRecord]:
    """Every plugin seen, built-ins first, including failed and blocked ones (never raises for a failed plugin)."""
    with self._lock:
      try: self.load()
      except DeviceError: pass  # strict mode: the records are still what `python -m plugrad plugins` shows
      return list(self._records)

  def conflicts(self) -> list[str]:
    """The device names and aliases claimed by more than one plugin (each unusable: PluginConflictError)."""
    with self._lock:
      try: self.load()
      except DeviceError: pass  # strict mode: listed all the same
      return list(self._conflicts)

  def resolve(self, name: str) -> str:
    """The device name that `name` (upper-cased; a name or an alias, no index) refers to. Raises UnknownDeviceError,
    PluginConflictError or the recorded PluginLoadError / PluginAPIVersionError of the plugin that declared it."""
    self.load()
    key = name.upper()
    if key in self._errors: raise self._errors[key]()
    if key in self._devices: return key
    if key in self._aliases: return self.resolve(self._aliases[key])
    raise self._unknown(key)

  def entry(self, name: str) -> DeviceEntry:
    key = self.resolve(name)  # first: loading replaces the tables
    return self._devices[key]

  def known(self) -> list[str]:
    """Every declared device name, usable or not (conflicting, refused by the version check, unavailable here)."""
    self.load()
    return sorted(self._known)

  def devices(self) -> list[DeviceEntry]:
    """The usable device entries (one active plugin each), highest priority first."""
    self.load()
    return sorted(self._devices.values(), key=lambda e: (-e.spec.priority, e.spec.name))

  def _probed(self, name: str) -> Probed:
    entry = self.entry(name)
    key = entry.spec.name
    if (p := self._probes.get(key)) is None:
      with self._lock:
        if (p := self._probes.get(key)) is None: p = self._probes[key] = _run_probe(entry, self.probe_timeout)
    return p

  def probe(self, name: str) -> str | None:
    """None when the device can be used here, else the probe's reason (cached; a device count of 0 is a reason too).
    A probe or count that raises or returns the wrong type is a plugin bug: PluginHookError; a probe that raises
    SettingsError (a user setting makes the device unusable, e.g. CC names no compiler) raises that again."""
    p = self._probed(name)
    if p.error is not None: raise p.error()
    return p.reason

  def count(self, name: str) -> int | None:
    """How many devices of this name exist here (DeviceSpec.count), or None when the plugin does not say. Raises what
    `probe` raises; only meaningful for an available device."""
    p = self._probed(name)
    if p.error is not None: raise p.error()
    return p.count

  def available(self) -> list[str]:
    """The usable device names whose probe passes, highest priority first. A probe that raises counts as unavailable
    (and is fatal under PLUGRAD_STRICT_PLUGINS=1)."""
    out = []
    for e in self.devices():
      try:
        if self.probe(e.spec.name) is None: out.append(e.spec.name)
      except (DeviceError, SettingsError):
        if self.strict: raise
    return out

  def fallback_causes(self, chosen: DeviceSpec | None) -> list[FallbackCause]:
    """Why the default device is `chosen` (None: nothing could be) rather than a device of higher priority. A failure,
    a conflict, a raising probe or count, or a misconfigured device outranking it is a cause; so is a device that is
    merely unavailable here (no driver, no compiler) or a plugin that failed before declaring its devices, but only
    when the default fell to a last resort (priority <= 0: the reference interpreter). Blocked plugins
    (PLUGRAD_PLUGINS, PLUGRAD_NO_PLUGINS) never are: that was asked for."""
    self.load()
    prio = chosen.priority if chosen is not None else None
    last_resort = prio is None or prio <= 0
    def outranks(p: int) -> bool: return p >= 0 and (prio is None or p > prio)
    out: list[FallbackCause] = []
    for key, cl in self._conflicts.items():
      if outranks(max(s.priority for s, _ in cl)): out.append(FallbackCause(str(self._errors[key]()), self._errors[key]))
    for rec in self._records:
      if rec.status != "failed": continue
      if rec.specs and not outranks(max(s.priority for s in rec.specs)): continue
      if not rec.specs and not last_resort: continue
      what = f"device(s) {', '.join(rec.devices)}: " if rec.specs else ""
      out.append(FallbackCause(f"{what}{str(rec.exception()).splitlines()[0]}", rec.exception))
    for e in self.devices():
      if not outranks(e.spec.priority) or (chosen is not None and e.spec.name == chosen.name): continue
      p = self._probed(e.spec.name)
      if p.error is not None: out.append(FallbackCause(str(p.error()), p.error, e.spec.name))
      elif p.reason is not None and last_resort:
        out.append(FallbackCause(f"device {e.spec.name} (priority {e.spec.priority}) is unavailable here: {p.reason}", None, e.spec.name))
    return out

  def call_component(self, hook: str, device: str, check: Callable[[Any], str | None] | None = None,
                     **kwargs: Any) -> tuple[Any, PluginRecord | None]:
    """Call a firstresult component hook, implementation by implementation in pluggy's order, so that the result (and
    any failure) is attributed to the plugin that produced it. Returns (result, its plugin) or (None, None). `check`
    says what is wrong with a result (None: nothing); a wrong result, like a raise, is PluginHookError naming the
    plugin when it declares the device, and skipped (with a warning) when it does not."""
    if hook not in hookspecs.COMPONENT_HOOKS: raise ValueError(f"{hook!r} is not a component hook; expected one of {hookspecs.COMPONENT_HOOKS}")
    self.load()
    args = {"device": device, **kwargs}
    for impl in reversed(getattr(self._pm.hook, hook).get_hookimpls()):
      rec = self._by_regname[impl.plugin_name]
      try: ret = impl.function(*[args[a] for a in impl.argnames])
      except Exception as e:
        if not self._foreign_failure(hook, device, rec, f"raised {type(e).__name__}: {e}", e):
          if isinstance(e, (DeviceError, SettingsError)): raise  # already typed by the plugin (unavailable driver, a bad THREADS, ...)
          raise PluginHookError(f"{hook}({device!r}) in plugin {rec.name!r} ({rec.label}) raised {type(e).__name__}: {e}") from e
        continue
      if ret is None: continue
      if check is not None and (wrong := check(ret)) is not None:
        if not self._foreign_failure(hook, device, rec, wrong):
          raise PluginHookError(f"{hook}({device!r}) in plugin {rec.name!r} ({rec.label}) {wrong}")
        continue
      return ret, rec
    return None, None

  def _foreign_failure(self, hook: str, device: str, rec: PluginRecord, what: str, e: Exception | None = None) -> bool:
    """Whether a hook that raised (`e`) or returned the wrong type for `device` (`what` says which) is skipped: when its
    plugin does not declare that device (a buggy override, or a plugin whose hook fails for every device), so that it
    never takes away another plugin's device. It warns once per plugin and hook; under PLUGRAD_STRICT_PLUGINS=1 it is an
    error instead."""
    name = device_name(device)
    if isinstance(e, SettingsError): return False  # the user's setting: reported, whoever reads it
    if any(name == s.name or name in s.aliases for s in rec.specs) or self.strict: return False
    if (rec.name, hook) not in self._skipped_hooks:
      self._skipped_hooks.add((rec.name, hook))
      warnings.warn(f"plugrad: plugin {rec.name!r} ({rec.label}): {hook}({device!r}) {what}; it does not declare "
                    f"{name}, so it was skipped and the next plugin's {hook} used (an override of {name} in it is not in effect)",
                    PluginWarning, stacklevel=4)
    return True

  def conformance_xfails(self, device: str) -> dict[str, str]:
    """The merged {test pattern: reason} every plugin declares for `device` (plugrad_conformance_xfails)."""
    self.load()
    out: dict[str, str] = {}
    for impl in reversed(self._pm.hook.plugrad_conformance_xfails.get_hookimpls()):
      rec = self._by_regname[impl.plugin_name]
      try: ret = impl.function(device)
      except Exception as e:
        if self._foreign_failure("plugrad_conformance_xfails", device, rec, f"raised {type(e).__name__}: {e}", e): continue
        raise PluginHookError(f"plugrad_conformance_xfails({device!r}) in plugin {rec.name!r} ({rec.label}) raised {type(e).__name__}: {e}") from e
      if ret is None: continue
      if not isinstance(ret, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in ret.items()):
        if self._foreign_failure("plugrad_conformance_xfails", device, rec, f"returned {type(ret).__name__}, not a dict of str to str"): continue
        raise PluginHookError(f"plugrad_conformance_xfails({device!r}) in plugin {rec.name!r} ({rec.label}) must return a dict of str to str "
                              f"or None, got {type(ret).__name__}")
      out.update(ret)
    return out

  def _unknown(self, key: str) -> DeviceError:
    def provides(r: PluginRecord) -> bool:
      d = normalize_dist(r.distribution)
      return r.name.lower() == key.lower() or d == f"plugrad-{key.lower()}" or FIRST_PARTY.get(key) == d
    for r in self._records:
      if r.status == "failed" and provides(r): return r.exception(key)
      if r.status == "blocked" and provides(r):
        return UnknownDeviceError(f"unknown device {key!r}: plugin {r.name!r} ({r.label}) probably provides it but is blocked ({r.reason}); "
                                  "add its name to PLUGRAD_PLUGINS or unset PLUGRAD_NO_PLUGINS")
    msg = f"unknown device {key!r}: no installed plugin provides it."
    if key in FIRST_PARTY: msg += f" It is provided by {FIRST_PARTY[key]}: pip install {FIRST_PARTY[key]}."
    names = sorted(self._devices) + sorted(self._aliases)
    if (close := difflib.get_close_matches(key, names, n=1)): msg += f" Did you mean {close[0]!r}?"
    msg += f" Known devices: {', '.join(sorted(self._known)) or 'none'}."
    if (failed := [r for r in self._records if r.status == "failed" and not r.specs]):
      msg += " These plugins failed to load and may provide it: " + "; ".join(f"{r.name!r} ({r.label}): {r.reason}" for r in failed) + \
             " (see `python -m plugrad plugins`)."
    return UnknownDeviceError(msg)


def _check_api(s: DeviceSpec, rec: PluginRecord) -> None:
  (major, minor), (cmaj, cmin) = s.api, API_VERSION
  if major == cmaj and minor <= cmin: return
  if (major, minor) > (cmaj, cmin): remedy = f"upgrade plugrad (pip install -U plugrad) or install a {rec.distribution} built for API {cmaj}.x"
  else: remedy = f"upgrade {rec.distribution} (pip install -U {rec.distribution}) or install a plugrad built for API {major}.x"
  raise PluginAPIVersionError(f"{rec.label} was built for plugin API {s.api_str}, this plugrad has {cmaj}.{cmin}: {remedy}")


@dataclass(frozen=True)
class FallbackCause:
  """One reason the default device is not a device of higher priority: its text, the error it stands for (None for a
  device that is merely unavailable here) and the declared device it is about (None: a plugin failure or conflict)."""
  text: str
  error: Callable[[], Exception] | None = None
  device: str | None = None


@dataclass(frozen=True)
class Probed:
  """What a device's probe and count said (once per manager): the reason it is unavailable, the error a misbehaving
  probe or count raises again on every use, and the count (None: not reported)."""
  reason: str | None = None
  error: Callable[[], Exception] | None = None
  count: int | None = None


def _raiser(make: Callable[[str], Exception], msg: str, cause: BaseException) -> Callable[[], Exception]:
  def raised() -> Exception:
    err = make(msg)
    err.__cause__ = cause
    return err
  return raised


class _Hung(Exception):
  """What `_call_plugin` gives back for a call that did not return within its deadline (the call goes on in its thread)."""
  def __init__(self, seconds: float):
    super().__init__(f"did not answer in {seconds:g} s")
    self.seconds = seconds


def _call_plugin(fn: Callable[[], Any], timeout: float = 0.0) -> tuple[Any, BaseException | None]:
  """fn()'s result, or the exception it raised: anything but Ctrl-C (SystemExit, RecursionError, ...) is the plugin's.
  With a timeout > 0 fn runs in a daemon thread (in a copy of the caller's context, so Context settings hold) and a call
  that has not returned by then gives `_Hung`: a thread cannot be stopped, so it is left behind, and it cannot keep the
  process from exiting."""
  if timeout <= 0:
    try: return fn(), None
    except KeyboardInterrupt: raise
    except BaseException as e: return None, e
  out: list[tuple[Any, BaseException | None]] = []
  def work() -> None:
    try: out.append((fn(), None))
    except BaseException as exc: out.append((None, exc))  # SystemExit in a thread would vanish silently: hand it back
  ctx = contextvars.copy_context()
  t = threading.Thread(target=ctx.run, args=(work,), name=f"plugrad-plugin-call:{getattr(fn, '__qualname__', fn)}", daemon=True)
  t.start()
  t.join(timeout)
  if not out: return None, _Hung(timeout)
  ret, err = out[0]
  if isinstance(err, KeyboardInterrupt): raise err
  return ret, err


def _run_probe(entry: DeviceEntry, timeout: float) -> Probed:
  spec, who = entry.spec, f"in plugin {entry.plugin.name!r} ({entry.plugin.label})"
  if entry.plugin.hung: return Probed(reason=entry.plugin.hung)  # its thread is still stuck: do not wait again per device
  def hung(what: str, e: _Hung) -> Probed:
    entry.plugin.hung = f"{what} did not answer in {e.seconds:g} s (device {spec.name} {who}; PLUGRAD_PROBE_TIMEOUT)"
    return Probed(reason=entry.plugin.hung)
  if spec.probe is not None:
    where = f"the probe of device {spec.name} {who}"
    ret, e = _call_plugin(spec.probe, timeout)
    if isinstance(e, _Hung): return hung("probe", e)
    if isinstance(e, SettingsError):  # a user setting makes the device unusable: misconfigured, not a plugin bug
      return Probed(error=_raiser(SettingsError, f"device {spec.name} is misconfigured: {e} ({who[3:]})", e))
    if e is not None:
      why = f"{where} raised {type(e).__name__}: {e}; a probe returns None or a reason string (or raises SettingsError for a bad setting)"
      return Probed(error=_raiser(PluginHookError, why, e))
    if ret is not None and not isinstance(ret, str):
      return Probed(error=_raiser(PluginHookError, f"{where} returned {_describe(ret)}; expected None or a reason string", TypeError(ret)))
    if ret is not None: return Probed(reason=ret)
  if spec.count is None: return Probed()
  n, e = _call_plugin(spec.count, timeout) if callable(spec.count) else (spec.count, None)
  where = f"the device count of {spec.name} {who}"
  if isinstance(e, _Hung): return hung("device count", e)
  if e is not None: return Probed(error=_raiser(PluginHookError, f"{where} raised {type(e).__name__}: {e}", e))
  if not isinstance(n, int) or isinstance(n, bool) or n < 0:
    return Probed(error=_raiser(PluginHookError, f"{where} returned {_describe(n)}; expected an int >= 0", TypeError(n)))
  if n == 0: return Probed(reason=f"plugin {entry.plugin.name!r} ({entry.plugin.label}) reports no {spec.name} devices here", count=0)
  return Probed(count=n)


def _conflict(key: str, claims: list[tuple[DeviceSpec, PluginRecord]]) -> ErrorFactory:
  who = " and ".join(f"{r.label} (entry point {r.name!r}{'' if s.name == key else f', as an alias of {s.name}'})" for s, r in claims)
  names = ",".join(dict.fromkeys(r.name for _, r in claims))
  msg = (f"device name {key!r} is claimed by more than one plugin: {who}. Uninstall one of them, or choose one with "
         f"PLUGRAD_PLUGINS (one of: {names}). To replace a single component of a device, use @hookimpl(tryfirst=True) "
         "on its component hook instead of declaring the device again.")
  return lambda: PluginConflictError(msg)


def _dist_of(ep: EntryPointLike) -> tuple[str, str]:
  dist = getattr(ep, "dist", None)
  if dist is None: return "unknown", "unknown"
  return str(getattr(dist, "name", None) or dist.metadata["Name"]), str(dist.version)


def _describe(x: Any) -> str:
  if isinstance(x, (list, tuple)) and x: return f"a {type(x).__name__} containing {', '.join(sorted({type(i).__name__ for i in x}))}"
  return f"{type(x).__name__} {x!r}"[:200]


def _reinstall_remedy(rec: PluginRecord) -> str:
  return (f"Remedy: reinstall or upgrade it (pip install -U {rec.distribution}) or uninstall it (pip uninstall {rec.distribution}); "
          "`python -m plugrad plugins` shows every plugin's status.")


def _hung_remedy(rec: PluginRecord) -> str:
  return (f"Remedy: {rec.distribution} hangs here (a driver or network call that never returns?): upgrade or uninstall it, leave it out "
          "with PLUGRAD_PLUGINS, or give it longer with PLUGRAD_PROBE_TIMEOUT.")


def _fix_remedy(rec: PluginRecord) -> str:
  return (f"Remedy: this is a bug in {rec.distribution}: upgrade it (pip install -U {rec.distribution}) or uninstall it; "
          "or leave it out with PLUGRAD_PLUGINS.")


# ---- the process-wide manager (replaceable, so that tests and embedders can start from a clean state)
_manager: PluginManager | None = None
_manager_lock = threading.Lock()


# the built-in PYTHON and NULL devices' plugin module, given by the package's top (plugrad/__init__.py): the manager sits
# below the built-in plugin, which imports plugrad.backend like any plugin, so it is handed the module, never imports it
_builtin_plugin: list[Callable[[], Any] | None] = [None]


def set_builtin_plugin(load: Callable[[], Any]) -> None:
  """`load()` returns the module of the built-in devices' hook implementations (imported when plugins are first loaded)."""
  _builtin_plugin[0] = load


def get_manager() -> PluginManager:
  """The process-wide manager (created on first use; plugins are loaded on the first device query, not here)."""
  global _manager
  if (mgr := _manager) is not None: return mgr  # the hot path (every device lookup) takes no lock
  with _manager_lock:
    if _manager is None: _manager = PluginManager()
    return _manager


def reset_manager(manager: PluginManager | None = None) -> None:
  """Replace the process-wide manager (None: a fresh one that re-reads the entry points and the environment)."""
  global _manager
  with _manager_lock: _manager = manager
