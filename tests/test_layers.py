"""The import rules of ARCHITECTURE §2 and §4, checked on the source (no imports run):

* inside the core, imports point down the floors (a function-level import too; `from plugrad import X` counts as an
  import of `plugrad.X` when X is a module, else of the top-level package);
* the core's module-level imports have no cycle, inside one floor included;
* backend code (every plugin and `plugrad/builtin/`) imports only `plugrad.backend` and the public `plugrad` names.
"""
from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = ROOT / "core" / "plugrad"
FLOORS = {"helpers": 0, "diskcache": 0, "trace": 0, "dtype": 0, "errors": 0,
          "uop": 1, "codegen": 2, "renderer": 2, "device": 3, "plugin": 3, "backend": 3, "builtin": 3,
          "engine": 4, "tensor": 5, "gradient": 5, "nn": 6, "testing": 6, "export": 6, "replay": 7, "viz": 7, "scaffold": 7,
          "__main__": 7, "__init__": 7}
PUBLIC = {"Context", "Device", "Tensor", "TinyJit", "Variable", "dtypes"}  # plugrad.__all__: what a backend may take from `plugrad`


def module_name(f: pathlib.Path) -> str:
  parts = f.relative_to(CORE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
  rel = pathlib.Path(*name.split(".")[1:])
  return (CORE / rel).with_suffix(".py").is_file() or (CORE / rel / "__init__.py").is_file()


def imports(f: pathlib.Path) -> Iterator[tuple[str, int, bool]]:
  """(imported module, line, at module level) for every plugrad import in `f`, relative ones resolved."""
  tree = ast.parse(f.read_text(), str(f))
  pkg = module_name(f).split(".") if f.name == "__init__.py" else module_name(f).split(".")[:-1]
  top = set(map(id, tree.body))
  for node in ast.walk(tree):
    at_top = id(node) in top
    if isinstance(node, ast.Import):
      for a in node.names: yield a.name, node.lineno, at_top
    elif isinstance(node, ast.ImportFrom):
      base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else [])) if node.level else node.module or ""
      for a in node.names:  # `from pkg import sub` imports the submodule sub
        yield (f"{base}.{a.name}" if base.startswith("plugrad") and is_module(f"{base}.{a.name}") else base), node.lineno, at_top


def floor(name: str) -> int | None:
  parts = name.split(".")
  if parts[0] != "plugrad": return None
  return FLOORS["__init__"] if len(parts) == 1 else FLOORS.get(parts[1])


def core_files() -> list[pathlib.Path]: return sorted(CORE.rglob("*.py"))


def test_core_imports_point_down() -> None:
  bad = []
  for f in core_files():
    here = floor(module_name(f))
    for name, line, _ in imports(f):
      there = floor(name)
      if here is not None and there is not None and there > here:
        bad.append(f"{f.relative_to(ROOT)}:{line}: {module_name(f)} (floor {here}) imports {name} (floor {there})")
      if name.startswith("plugrad_"): bad.append(f"{f.relative_to(ROOT)}:{line}: the core imports the plugin package {name}")
  assert not bad, "imports that point up the layers (ARCHITECTURE §2):\n" + "\n".join(bad)


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
  """Each cycle of `graph` found by a depth-first walk, as "a -> b -> a". A submodule's import of its own package
  (whose __init__ re-exports it) is not an edge."""
  cycles: list[str] = []
  state = dict.fromkeys(graph, 0)
  def visit(m: str, path: list[str]) -> None:
    state[m] = 1
    for n in sorted(graph.get(m, ())):
      if m.startswith(n + "."): continue
      if state.get(n) == 1: cycles.append(" -> ".join(path[path.index(n):] + [n]))
      elif state.get(n) == 0: visit(n, path + [n])
    state[m] = 2
  for m in sorted(graph):
    if state[m] == 0: visit(m, [m])
  return cycles


def test_the_cycle_finder_finds_cycles_inside_one_floor() -> None:
  graph = {"plugrad.device.a": {"plugrad.device.b"}, "plugrad.device.b": {"plugrad.device.a"}, "plugrad.device": {"plugrad.device.a"},
           "plugrad.device.c": {"plugrad.device"}}
  assert find_cycles(graph) == ["plugrad.device.a -> plugrad.device.b -> plugrad.device.a"]


def test_core_has_no_import_cycles() -> None:
  graph = {module_name(f): {n for n, _, top in imports(f) if top and n.startswith("plugrad") and n != module_name(f) and is_module(n)}
           for f in core_files()}
  cycles = find_cycles(graph)
  assert not cycles, "module-level import cycles in the core:\n" + "\n".join(cycles)


def backend_files() -> list[pathlib.Path]:
  # examples/plugrad-opencl is the third-party backend written from docs/writing-a-backend.md alone: it keeps the rule too
  return sorted(p for d in [*ROOT.glob("plugins/*/plugrad_*"), *ROOT.glob("examples/*/plugrad_*"), CORE / "builtin"] if d.is_dir()
                for p in d.rglob("*.py"))


@pytest.mark.parametrize("f", backend_files(), ids=lambda f: str(f.relative_to(ROOT)))
def test_backends_import_only_the_backend_namespace(f: pathlib.Path) -> None:
  bad = []
  tree = ast.parse(f.read_text(), str(f))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      bad += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.startswith("plugrad.") and a.name != "plugrad.backend"]
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
      if node.module == "plugrad":
        bad += [f"line {node.lineno}: from plugrad import {a.name} (not a public name)" for a in node.names if a.name not in PUBLIC | {"backend"}]
      elif node.module.startswith("plugrad.") and node.module != "plugrad.backend":
        bad.append(f"line {node.lineno}: from {node.module} import ...")
  assert not bad, f"{f.relative_to(ROOT)} must import only plugrad.backend and public plugrad names:\n" + "\n".join(bad)


def test_the_backend_namespace_exports_what_it_documents() -> None:
  import plugrad.backend as backend
  missing = [n for n in backend.__all__ if not hasattr(backend, n)]
  assert not missing, f"plugrad.backend.__all__ names missing from the module: {missing}"
  assert len(set(backend.__all__)) == len(backend.__all__), "plugrad.backend.__all__ lists a name twice"


def test_a_deprecated_backend_name_still_imports_and_warns() -> None:
  import plugrad.backend as backend
  from plugrad import Device
  assert "Device" not in backend.__all__
  with pytest.warns(DeprecationWarning, match=r"plugrad\.backend\.Device is deprecated .*import Device from plugrad"):
    from plugrad.backend import Device as old
  assert old is Device
  with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"): backend.NoSuchName  # noqa: B018

