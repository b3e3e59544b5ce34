"""`python -m plugrad new-backend NAME`: a minimal plugin distribution to start a backend from.

It installs, registers its device and passes the render tier of the conformance suite as generated (with the one
kernel a renderer without launch indices cannot render declared as an expected failure); the device is unavailable
(its probe says what to write) until the compiler and runtime are filled in. The generated code imports only
`plugrad.backend`, as docs/writing-a-backend.md requires.
"""
from __future__ import annotations

import pathlib
import re
from string import Template

from plugrad.plugin.hookspecs import API_VERSION
from plugrad.plugin.manager import core_version

NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


class ScaffoldError(ValueError):
  """A name that cannot be a device name, or a target directory that already exists."""


PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "The $NAME device for plugrad"
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["$requires"]

[project.optional-dependencies]
test = ["pytest"]

[project.entry-points.plugrad]
$ep = "$pkg.plugin"

[tool.setuptools]
packages = ["$pkg"]

[tool.ruff]
line-length = 150
indent-width = 2
"""

README = """\
# $dist

The `$NAME` device for [plugrad](https://pypi.org/project/plugrad/), started from `python -m plugrad new-backend $ep`.
The contract is docs/writing-a-backend.md in plugrad's repository; a backend imports only `plugrad.backend`.

## What to fill in

| file | what | status |
|---|---|---|
| `$pkg/plugin.py` | the `DeviceSpec`, the hooks, `probe()`, the declared expected failures | done; `probe()` returns None once it runs |
| `$pkg/renderer.py` | `${cls}Renderer`: kernels as source text (a `CStyleRenderer` dialect) | renders C; set your dialect's hooks and capabilities |
| `$pkg/compiler.py` | `${cls}Compiler.compile(src) -> bytes` | to write |
| `$pkg/runtime.py` | `${cls}Allocator` (device memory) and `${cls}Runtime.load(program)` (a launchable kernel) | to write |

Until `probe()` returns None the device is listed as unavailable (`python -m plugrad devices $NAME`) with the reason
it gives. Its priority is negative, so it is never the default device; `DEV=$NAME` selects it.

## Checking it

```bash
pip install -e .[test]
python -m plugrad plugins                              # $ep  $dist  0.1.0  $api  $NAME  active
python -m plugrad conformance $NAME --tiers render     # the conformance suite, as a Markdown report
pytest tests                                           # the same, as a test
```

As generated, the render tier passes: the C-family renderer renders every suite kernel the device's (default)
capabilities allow, except `global_ids`, which needs launch indices; `plugin.py` declares it as an expected failure.
Declared failures are strict: remove one when it starts passing. Add `compile` to the tiers once `compiler.py` is
written, and drop `--tiers` (all four: render, compile, emulate, run) once `runtime.py` works and the probe passes.
`python -m plugrad conformance $NAME --report CONFORMANCE.md` writes the report to paste here.
"""

PLUGIN = '''\
"""Registration only: importing this module must stay cheap (the components are imported inside the hooks)."""
from __future__ import annotations

from typing import Any

from plugrad.backend import DeviceSpec, for_device, hookimpl

NAME = "$NAME"
API = $api_tuple  # the plugin API this code is written against: a literal (plugrad.backend.API_VERSION is whatever core is installed)


def probe() -> str | None:
  # cheap and never raises: None when the device can be used here, else why not and what to do
  return "$dist is a skeleton: implement the runtime in $pkg/runtime.py"


@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  # a negative priority: never the default device (DEV=$NAME chooses it); once it runs, rank it with PYTHON 0, CPU 100, GPUs 200
  return [DeviceSpec(NAME, api=API, priority=-1, probe=probe, description="$NAME (skeleton)")]


@hookimpl
@for_device(NAME)  # the hook answers None for another plugin's device
def plugrad_renderer(device: str) -> Any:
  from $pkg.renderer import ${cls}Renderer
  return ${cls}Renderer(device)


@hookimpl
@for_device(NAME)
def plugrad_compiler(device: str, renderer: Any) -> Any:
  from $pkg.compiler import ${cls}Compiler
  return ${cls}Compiler()


@hookimpl
@for_device(NAME)
def plugrad_allocator(device: str) -> Any:
  from $pkg.runtime import ${cls}Allocator
  return ${cls}Allocator(device)


@hookimpl
@for_device(NAME)
def plugrad_runtime(device: str) -> Any:
  from $pkg.runtime import ${cls}Runtime
  return ${cls}Runtime(device)


# conformance tests this device is known to fail, with the reason: strict, so one that starts passing fails the run
XFAILS = {f"test_kernel[global_ids-{tier}]": "no launch indices: set has_local and render gidx/lidx (render_special) in renderer.py"
          for tier in ("render", "compile", "run")}


@hookimpl
@for_device(NAME)
def plugrad_conformance_xfails(device: str) -> dict[str, str] | None:
  return dict(XFAILS)
'''

RENDERER = '''\
"""Kernels as source text. `CStyleRenderer` renders any LINEAR program as one C-like function with the reference
interpreter's semantics; a dialect sets its attributes and overrides the hooks it needs (docs/writing-a-backend.md,
"A C-family backend"). Claim a capability (float16, locals, shared, ...) only once the device has it."""
from __future__ import annotations

from plugrad.backend import CStyleRenderer


class ${cls}Renderer(CStyleRenderer):
  # the base's defaults: no workgroups, float32 and int32 compute; the codegen lowers everything else
  def __init__(self, device: str):
    super().__init__(device)
    self.validate()  # capabilities and flags that disagree fail here, at the device's first use
'''

COMPILER = '''\
"""Source text to the bytes the runtime loads."""
from __future__ import annotations

from plugrad.backend import Compiler


class ${cls}Compiler(Compiler):
  # the compiler's identity and flags once compile works (binaries are cached on disk under it); None: no caching
  cache_key: str | None = None

  def compile(self, src: str) -> bytes:
    # raise CompileError(the toolchain's message) for source that does not compile
    raise NotImplementedError("$dist is a skeleton: write ${cls}Compiler.compile(src) -> bytes in $pkg/compiler.py")
'''

RUNTIME = '''\
"""Device memory and kernel launches."""
from __future__ import annotations

from typing import Any

from plugrad.backend import Allocator, BufferSpec, ProgramUOp, Runtime


def _todo(method: str, what: str) -> NotImplementedError:
  return NotImplementedError(f"$dist is a skeleton: write {method} in $pkg/runtime.py ({what})")


class ${cls}Allocator(Allocator[Any]):
  def _alloc(self, nbytes: int, options: BufferSpec | None) -> Any: raise _todo("${cls}Allocator._alloc", "a handle to nbytes of device memory")
  def _free(self, handle: Any, nbytes: int, options: BufferSpec | None) -> None: raise _todo("${cls}Allocator._free", "release the handle")
  def _copyin(self, handle: Any, src: memoryview) -> None: raise _todo("${cls}Allocator._copyin", "host bytes to the device")
  def _copyout(self, dest: memoryview, handle: Any) -> None: raise _todo("${cls}Allocator._copyout", "device bytes to the host")


class ${cls}Runtime(Runtime):
  def load(self, program: ProgramUOp) -> Any:
    # a callable: fn(*buffer_handles, global_size=(x, y, z), local_size=(x, y, z), vals=(ints...), wait=False)
    raise _todo("${cls}Runtime.load", "program.binary to a launchable kernel")
'''

TEST = '''\
"""The plugrad conformance suite on $NAME, through `python -m plugrad conformance` (the report is printed on failure).
Widen TIERS as the backend grows: add compile once compiler.py works; None (all four tiers) once runtime.py does."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

TIERS: str | None = "render"


def test_conformance(tmp_path: pathlib.Path) -> None:
  out = tmp_path / "conformance.json"
  cmd = [sys.executable, "-m", "plugrad", "conformance", "$NAME", "--json", str(out)] + (["--tiers", TIERS] if TIERS else [])
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
  report = json.loads(out.read_text())
  assert report["ok"] and sum(t["passed"] for t in report["tiers"].values()) > 0, proc.stdout
'''


def names(name: str) -> dict[str, str]:
  """The names the skeleton uses for `name` (e.g. `vulkan`): device VULKAN, package plugrad_vulkan, ..."""
  if not NAME_RE.fullmatch(name):
    raise ScaffoldError(f"{name!r} is not a device name: a letter, then letters, digits or underscores (e.g. vulkan, my_npu)")
  low = name.lower()
  v = re.match(r"(\d+)\.(\d+)", core_version())  # no match: plugrad run from a source tree, not installed
  requires = f"plugrad>={v[1]}.{v[2]},<{int(v[1]) + 1 if int(v[1]) else 1}" if v else "plugrad"
  return {"NAME": name.upper(), "ep": low, "pkg": f"plugrad_{low}", "dist": f"plugrad-{low.replace('_', '-')}",
          "cls": "".join(p.capitalize() for p in low.split("_") if p), "api": f"{API_VERSION[0]}.{API_VERSION[1]}", "api_tuple": repr(API_VERSION),
          "requires": requires}


def files(name: str) -> dict[str, str]:
  """The skeleton's files, relative to its root, with their text."""
  n = names(name)
  pkg = n["pkg"]
  templates = {"pyproject.toml": PYPROJECT, "README.md": README, f"{pkg}/__init__.py": f'"""{n["dist"]}: the {n["NAME"]} device for plugrad."""\n',
               f"{pkg}/plugin.py": PLUGIN, f"{pkg}/renderer.py": RENDERER, f"{pkg}/compiler.py": COMPILER, f"{pkg}/runtime.py": RUNTIME,
               f"tests/test_{n['ep']}_conformance.py": TEST}
  return {path: Template(text).substitute(n) for path, text in templates.items()}


def write_skeleton(name: str, out: pathlib.Path) -> pathlib.Path:
  """Writes the skeleton to `out/plugrad-<name>/` and returns that directory; refuses an existing one."""
  content = files(name)
  root = out / names(name)["dist"]
  if root.exists(): raise ScaffoldError(f"{root} already exists: choose another --out or remove it")
  for path, text in content.items():
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)
  return root
