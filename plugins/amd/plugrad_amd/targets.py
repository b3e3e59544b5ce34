"""The AMD GPU architectures plugrad-amd compiles for, and how `AMD_ARCH` is read.

| arch | family | wave | tensor cores | PYTHON emulation |
|---|---|---|---|---|
| gfx942 (MI300) | CDNA3 | 64 | MFMA `v_mfma_f32_16x16x16_{f16,bf16}` | `EMULATE=AMD_MFMA` |
| gfx1100, gfx1101, gfx1102 (RX 7000) | RDNA3 | 32 | WMMA `v_wmma_f32_16x16x16_{f16,bf16}` | `EMULATE=AMD` |
| gfx1200, gfx1201 (RX 9000) | RDNA4 | 32 | none yet (gfx12's WMMA has another layout, not described) | `EMULATE=AMD` (limits only) |

A device reports its arch as a target ID with features (`gfx942:sramecc+:xnack-`); the features are dropped, so the
code object is built for "any" setting of them and loads either way.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from plugrad.backend import parse_setting


@dataclass(frozen=True)
class Arch:
  name: str                 # the processor, as clang's --offload-arch / -mcpu takes it
  family: str               # CDNA3, RDNA3, RDNA4
  wave: int                 # lanes per wavefront (the code object's .wavefront_size)
  matrix: str | None        # "MFMA", "WMMA" or None
  emulate: str              # the PYTHON interpreter's target that describes it


ARCHS: dict[str, Arch] = {a.name: a for a in (
  Arch("gfx942", "CDNA3", 64, "MFMA", "AMD_MFMA"),
  Arch("gfx1100", "RDNA3", 32, "WMMA", "AMD"), Arch("gfx1101", "RDNA3", 32, "WMMA", "AMD"), Arch("gfx1102", "RDNA3", 32, "WMMA", "AMD"),
  Arch("gfx1200", "RDNA4", 32, None, "AMD"), Arch("gfx1201", "RDNA4", 32, None, "AMD"),
)}
DEFAULT_ARCH = "gfx942"  # without AMD_ARCH and without a GPU to ask: MI300 (CDNA3), the datacenter target
_TARGET_ID = re.compile(r"(gfx[0-9a-f]+)((?::[a-z0-9_-]+[+-])*)")


class UnsupportedArchError(ValueError):
  """An arch plugrad-amd does not compile for."""


def base_arch(target_id: str) -> str:
  """`gfx942` from `gfx942:sramecc+:xnack-` (ValueError when it is not a target ID)."""
  if (m := _TARGET_ID.fullmatch(target_id.strip())) is None:
    raise ValueError(f"{target_id!r} is not an AMDGPU target ID (gfx942, gfx1100, gfx942:sramecc+:xnack- ...)")
  return m.group(1)


def get_arch(target_id: str) -> Arch:
  name = base_arch(target_id)
  if name not in ARCHS:
    raise UnsupportedArchError(f"{name} is not supported by plugrad-amd; supported: {', '.join(ARCHS)}")
  return ARCHS[name]


def env_arch(env: dict[str, str] | None = None) -> Arch | None:
  """The arch AMD_ARCH names (None when unset or blank; target features such as `:xnack-` are dropped); a malformed or
  unsupported value is a SettingsError naming the variable and the supported archs."""
  import os
  raw = (os.environ if env is None else env).get("AMD_ARCH", "")
  if not raw.strip(): return None
  try: name = base_arch(raw)
  except ValueError: name = raw
  return ARCHS[parse_setting("AMD_ARCH", name, "", choices=tuple(ARCHS))]
