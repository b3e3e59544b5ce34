"""The BEAM cache (codegen/opt/search.py): signed entries, a size/depth-limited parser, LRU eviction under CACHE_MB."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from plugrad import Tensor, diskcache
from plugrad.codegen.opt import Opt, OptOps, Scheduler, search
from plugrad.device.registry import Device
from plugrad.engine.schedule import create_schedule


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scheduler:
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path / "cache"))
  t = (Tensor.arange(64).float().reshape(8, 8) * 2).sum(axis=1)
  items, _ = create_schedule(t.uop)
  ast = [it for it in items if it.kind == "kernel"][-1].ast
  return Scheduler(ast, Device["CPU"].renderer)


def entry(k: Scheduler) -> Path:
  d = diskcache.secure_dir()
  assert d is not None
  return d / "beam" / search._cache_name(k, 2)


def sign(k: Scheduler, body: bytes) -> bytes:
  d = diskcache.secure_dir()
  assert d is not None and (key := diskcache.secret(d)) is not None
  return diskcache.digest(key, search._cache_name(k, 2).encode(), body).hex().encode() + b"\n" + body


def test_round_trip(kernel: Scheduler):
  opts = [Opt(OptOps.UPCAST, 0, 2)]
  search._store(kernel, 2, opts)
  assert search.cached_actions(kernel, 2) == opts
  assert (entry(kernel).stat().st_mode & 0o077) == 0 or (entry(kernel).parent.parent.stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("signed", [False, True])
def test_deeply_nested_file_is_a_miss(kernel: Scheduler, signed: bool):
  body = b"[" * 200_000 + b"]" * 200_000
  search._store(kernel, 2, [])
  path = entry(kernel)
  path.write_bytes(sign(kernel, body) if signed else body)
  assert search.cached_actions(kernel, 2) is None  # no RecursionError
  path.write_bytes(sign(kernel, b"[" * 3000 + b"]" * 3000)[:60_000])
  assert search.cached_actions(kernel, 2) is None


@pytest.mark.parametrize("body", [b'[["UPCAST", 0, 2]]', b"not json", b"\xff\xfe", b"", b'{"a": 1}', b'[["NOPE", 0, 2]]'])
def test_unsigned_or_malformed_entries_are_misses(kernel: Scheduler, body: bytes):
  search._store(kernel, 2, [])
  entry(kernel).write_bytes(body)  # unsigned: even a well-formed list of actions is not trusted
  assert search.cached_actions(kernel, 2) is None
  if body != b"\xff\xfe":
    entry(kernel).write_bytes(sign(kernel, body))
    assert search.cached_actions(kernel, 2) == ([Opt(OptOps.UPCAST, 0, 2)] if body.startswith(b'[["UPCAST"') else None)


def test_oversized_entry_is_a_miss(kernel: Scheduler):
  search._store(kernel, 2, [])
  entry(kernel).write_bytes(sign(kernel, json.dumps([["UPCAST", 0, 2]] * 20_000).encode()))
  assert search.cached_actions(kernel, 2) is None


def test_size_cap_evicts_least_recently_used(tmp_path: Path):
  d = tmp_path / "beam"
  d.mkdir()
  for i in range(5):
    (d / f"{i}.json").write_bytes(bytes(1000))
    os.utime(d / f"{i}.json", (time.time() - 100 + i, time.time() - 100 + i))
  os.utime(d / "0.json")  # used just now
  search._evict(d, 3000)
  assert sorted(p.name for p in d.iterdir()) == ["0.json", "3.json", "4.json"]


# ---- fuzzing (issue 22, item 6): random bytes over a stored entry are a miss or the entry itself, never an exception

def _fuzzed(rng, raw: bytes) -> bytes:
  out = bytearray(raw)
  for _ in range(rng.choice([1, 1, 2, 4])):
    at, n = rng.randrange(len(out)), rng.choice([1, 1, 2, 5])
    out[at:at + n] = rng.randbytes(n) if rng.random() < 0.7 else rng.choice([b"[", b"]", b'"', b",", b"0", b"-1", b"9" * 400, b"[" * 50])
  return bytes(out[:rng.randrange(len(out) + 1)] if rng.random() < 0.1 else out)


def test_fuzz_damaged_entries_are_misses(kernel: Scheduler):
  import random
  opts = [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 4)]
  search._store(kernel, 2, opts)
  path, good = entry(kernel), entry(kernel).read_bytes()
  rng, hits = random.Random(22), 0
  for _ in range(300):
    bad = _fuzzed(rng, good)
    path.write_bytes(bad)
    got = search.cached_actions(kernel, 2)  # never raises
    assert got is None or got == opts, bad  # a hit only where the damage changed nothing that counts (e.g. the hex's case)
    hits += got is not None
  assert hits < 30


def test_fuzz_signed_garbage_never_breaks_a_search(kernel: Scheduler):
  # a body that passes the HMAC but is not what plugrad wrote (only a bug, or someone with the secret, can make one):
  # a miss, or actions that apply to the kernel or are refused with KernelOptError (what beam_search catches)
  import random

  from plugrad.codegen.opt.kernel import KernelOptError
  search._store(kernel, 2, [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 4)])
  body = entry(kernel).read_bytes().partition(b"\n")[2]
  rng = random.Random(23)
  names = [o.name for o in OptOps] + ["NOPE", ""]
  def value() -> object: return rng.choice([rng.randint(-3, 64), rng.choice(names), None, 1.5, True, [0], {"a": 1}, 2**70])
  for i in range(400):
    if i % 2: bad = _fuzzed(rng, body)
    else:  # well-formed JSON of the wrong kind: random actions, arities and types
      bad = json.dumps([[rng.choice(names), value(), value()][:rng.choice([3, 3, 3, 2, 4])] for _ in range(rng.randint(0, 4))]).encode()
    entry(kernel).write_bytes(sign(kernel, bad))
    if (got := search.cached_actions(kernel, 2)) is None: continue
    try: kernel.copy().apply_opts(got)
    except KernelOptError: pass
