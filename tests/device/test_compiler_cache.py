"""The Compiler base: the persistent sqlite compile cache (across instances and processes, CACHE=0, PLUGRAD_CACHE_DIR,
a corrupt or unusable cache; its integrity checks: tests/robustness) and compile errors with the kernel name and the source near the error."""
from __future__ import annotations

import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugrad.device.compiler import Compiler, cache_path, error_line
from plugrad.errors import CompileError, PluginHookError
from plugrad.helpers import Context

REPO = Path(__file__).resolve().parents[2]


class PyCompiler(Compiler):
  """Compiles Python source to a marshalled code object, counting real compilations."""
  cache_key = f"cpython-{sys.version_info.major}.{sys.version_info.minor} marshal"
  calls = 0

  def __init__(self, flags: str = ""):
    if flags: self.cache_key = f"{PyCompiler.cache_key} {flags}"

  def compile(self, src: str) -> bytes:
    PyCompiler.calls += 1
    try: code = compile(src, "<kernel>", "exec")
    except SyntaxError as e: raise CompileError(f"<kernel>, line {e.lineno}: SyntaxError: {e.msg}") from None
    return marshal.dumps(code)


def run_lib(lib: bytes) -> dict:
  ns: dict = {}
  exec(marshal.loads(lib), ns)
  return ns


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  PyCompiler.calls = 0
  with Context(CACHE=1): yield tmp_path


def fresh_src(tag: str) -> str: return f"# {tag} {os.getpid()} {id(tag)}\nresult = 6 * 7\n"


def test_cache_hit_across_instances(cache: Path):
  src = fresh_src("instances")
  lib = PyCompiler().compile_cached(src, "k")
  assert PyCompiler.calls == 1 and run_lib(lib)["result"] == 42
  assert PyCompiler().compile_cached(src, "k") == lib and PyCompiler.calls == 1
  assert cache_path() == cache / "cache.db" and (cache / "cache.db").is_file()


def test_cache_key_includes_compiler_flags(cache: Path):
  src = fresh_src("flags")
  PyCompiler().compile_cached(src)
  PyCompiler("-O2").compile_cached(src)
  assert PyCompiler.calls == 2
  PyCompiler("-O2").compile_cached(src)
  assert PyCompiler.calls == 2


def test_no_cache_key_means_no_caching(cache: Path):
  class Uncached(PyCompiler): cache_key = None
  src = fresh_src("uncached")
  Uncached().compile_cached(src)
  Uncached().compile_cached(src)
  assert PyCompiler.calls == 2


def test_cache_0_disables_reading_and_writing(cache: Path):
  src = fresh_src("cache0")
  with Context(CACHE=0):
    PyCompiler().compile_cached(src)
    PyCompiler().compile_cached(src)
  assert PyCompiler.calls == 2
  PyCompiler().compile_cached(src)  # nothing was written
  assert PyCompiler.calls == 3
  with Context(CACHE=0):
    PyCompiler().compile_cached(src)  # and what is there now is not read
  assert PyCompiler.calls == 4


CHILD = """
import sys
from tests.device.test_compiler_cache import PyCompiler
lib = PyCompiler().compile_cached(sys.argv[1], "child")
print(PyCompiler.calls, len(lib))
"""


def run_child(src: str, cache: Path) -> subprocess.Popen:
  env = {**os.environ, "PLUGRAD_CACHE_DIR": str(cache), "CACHE": "1"}
  return subprocess.Popen([sys.executable, "-c", CHILD, src], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def child_calls(proc: subprocess.Popen) -> int:
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err
  return int(out.split()[0])


def test_cache_hit_across_processes(cache: Path):
  src = fresh_src("processes")
  assert child_calls(run_child(src, cache)) == 1  # the child compiles and stores
  PyCompiler().compile_cached(src)
  assert PyCompiler.calls == 0  # this process reads it
  src2 = fresh_src("processes-2")
  PyCompiler().compile_cached(src2)
  assert child_calls(run_child(src2, cache)) == 0  # and the other way round


def test_concurrent_processes_share_the_cache(cache: Path):
  srcs = [fresh_src(f"concurrent-{i % 3}") for i in range(6)]
  procs = [run_child(s, cache) for s in srcs]
  assert all(child_calls(p) in (0, 1) for p in procs)
  for s in set(srcs): PyCompiler().compile_cached(s)
  assert PyCompiler.calls == 0  # every source ended up stored


def test_corrupt_cache_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
  from plugrad.diskcache import CacheWarning
  (tmp_path / "cache.db").write_bytes(b"this is not a sqlite database" * 100)
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  PyCompiler.calls = 0
  src = fresh_src("corrupt")
  with Context(CACHE=1), pytest.warns(CacheWarning, match="was damaged .* moved it to cache.db.broken"):
    assert run_lib(PyCompiler().compile_cached(src))["result"] == 42
  PyCompiler().compile_cached(src)
  assert PyCompiler.calls == 1  # the new database holds it
  assert (tmp_path / "cache.db.broken").read_bytes().startswith(b"this is not")


def test_unusable_cache_dir_degrades_to_no_caching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
  from plugrad.diskcache import CacheWarning
  (tmp_path / "a_file").write_text("not a directory")
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path / "a_file" / "sub"))
  PyCompiler.calls = 0
  src = fresh_src("unusable")
  with Context(CACHE=1), pytest.warns(CacheWarning, match="caching is off"):
    PyCompiler().compile_cached(src)
    PyCompiler().compile_cached(src)
  assert PyCompiler.calls == 2


def test_compile_error_names_the_kernel_and_shows_the_source(cache: Path):
  src = "a = 1\nb = 2\nc = (3\nd = 4\ne = 5\nf = 6\ng = 7\n"
  with pytest.raises(CompileError) as ei:
    PyCompiler().compile_cached(src, "E_4_4")
  msg = str(ei.value)
  assert msg.startswith("kernel 'E_4_4' failed to compile (PyCompiler):\n<kernel>, line 3: SyntaxError")
  assert "source near line 3:" in msg and ">    3 | c = (3" in msg and "     1 | a = 1" in msg and "     5 | e = 5" in msg and "f = 6" not in msg
  assert ei.value.kernel == "E_4_4" and ei.value.source == src  # type: ignore[attr-defined]
  assert isinstance(ei.value.__cause__, CompileError)
  PyCompiler().compile_cached(src.replace("(3", "3"), "E_4_4")  # failures are not cached


def test_error_line_formats():
  src = "\n".join(f"line{i}" for i in range(1, 21))
  assert error_line("kernel.c:12:5: error: expected ';'", src) == 12
  assert error_line("program_source:3:1: error: unknown type", src) == 3
  assert error_line("default_program(7): error: identifier undefined", src) == 7
  assert error_line("File <kernel>, line 19", src) == 19
  assert error_line("kernel.c:99:1: error", src) is None  # outside the source
  assert error_line("internal compiler error", src) is None


def test_compile_must_return_bytes(cache: Path):
  class Bad(Compiler):
    cache_key = None
    def compile(self, src: str) -> bytes: return src  # type: ignore[return-value]
  with pytest.raises(PluginHookError, match=r"Bad.compile must return bytes, got str \(kernel 'k'\)"):
    Bad().compile_cached("x", "k")
  with pytest.raises(TypeError, match="source as a str"):
    PyCompiler().compile_cached(b"x = 1")  # type: ignore[arg-type]


def test_disassemble_is_optional():
  with pytest.raises(NotImplementedError, match="PyCompiler has no disassembler"):
    PyCompiler().disassemble(b"")
  with pytest.raises(NotImplementedError, match="must implement compile"):
    Compiler().compile("x")

