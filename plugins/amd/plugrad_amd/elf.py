"""Reading an AMDGPU code object (an ELF64 shared object) without ROCm: its header, symbols, the AMDGPU metadata note
and the kernel descriptors, so a code object can be checked against the kernel it was built for.

Sources: the LLVM AMDGPU backend documentation (llvm.org/docs/AMDGPUUsage.html): "ELF Code Object" (EM_AMDGPU = 224,
ELFOSABI_AMDGPU_HSA = 64, the EF_AMDGPU_MACH values), "Code Object Metadata" (note owner "AMDGPU", type
NT_AMDGPU_METADATA = 32, a MessagePack map with `amdhsa.kernels`), and "Kernel Descriptor" (64 bytes at the symbol
`NAME.kd`). The MessagePack decoder below reads the subset the metadata uses (maps, arrays, strings, ints, floats,
bools, nil, binary).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA = 64
NT_AMDGPU_METADATA = 32
SHT_SYMTAB, SHT_NOTE, SHT_DYNSYM = 2, 7, 11
STT_OBJECT, STT_FUNC = 1, 2
# EF_AMDGPU_MACH (the low byte of e_flags) of the archs plugrad-amd builds for
MACH = {0x04C: "gfx942", 0x041: "gfx1100", 0x046: "gfx1101", 0x047: "gfx1102", 0x048: "gfx1200", 0x04E: "gfx1201"}
EF_AMDGPU_MACH = 0x0FF


class ELFError(ValueError):
  """Not a well-formed AMDGPU code object."""


# ---- MessagePack (the subset of the metadata note)

def unpack_msgpack(data: bytes) -> Any:
  value, end = _mp(data, 0)
  if end != len(data): raise ELFError(f"msgpack: {len(data) - end} bytes after the value")
  return value


def _mp(b: bytes, i: int) -> tuple[Any, int]:
  if i >= len(b): raise ELFError("msgpack: truncated")
  t = b[i]
  i += 1
  def take(n: int) -> bytes:
    if i + n > len(b): raise ELFError("msgpack: truncated")
    return b[i:i + n]
  def seq(n: int, j: int, pairs: bool) -> tuple[Any, int]:
    if pairs:
      out: dict[Any, Any] = {}
      for _ in range(n):
        k, j = _mp(b, j)
        out[k], j = _mp(b, j)
      return out, j
    items = []
    for _ in range(n):
      v, j = _mp(b, j)
      items.append(v)
    return items, j
  if t <= 0x7F: return t, i
  if t >= 0xE0: return t - 0x100, i
  if 0x80 <= t <= 0x8F: return seq(t & 0x0F, i, True)
  if 0x90 <= t <= 0x9F: return seq(t & 0x0F, i, False)
  if 0xA0 <= t <= 0xBF: return take(t & 0x1F).decode(), i + (t & 0x1F)
  if t == 0xC0: return None, i
  if t in (0xC2, 0xC3): return t == 0xC3, i
  sizes = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4, 0xDC: 2, 0xDD: 4, 0xDE: 2, 0xDF: 4}
  if t in sizes:
    w = sizes[t]
    n = int.from_bytes(take(w), "big")
    i += w
    if t in (0xDC, 0xDD): return seq(n, i, False)
    if t in (0xDE, 0xDF): return seq(n, i, True)
    raw = take(n)
    return (raw.decode() if t >= 0xD9 else bytes(raw)), i + n
  fixed = {0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
  if t in fixed:
    n = struct.calcsize(fixed[t])
    return struct.unpack(fixed[t], take(n))[0], i + n
  raise ELFError(f"msgpack: unsupported type byte 0x{t:02x}")


# ---- ELF

@dataclass(frozen=True)
class Section:
  name: str
  type: int
  offset: int
  size: int
  addr: int
  link: int
  entsize: int


@dataclass(frozen=True)
class Symbol:
  name: str
  type: int       # STT_FUNC for a kernel's code, STT_OBJECT for its descriptor (NAME.kd)
  bind: int
  section: int
  value: int
  size: int


@dataclass(frozen=True)
class KernelDescriptor:
  """The 64-byte kernel descriptor (AMDGPUUsage "Kernel Descriptor")."""
  group_segment_fixed_size: int
  private_segment_fixed_size: int
  kernarg_size: int
  kernel_code_entry_byte_offset: int
  compute_pgm_rsrc3: int
  compute_pgm_rsrc1: int
  compute_pgm_rsrc2: int
  kernel_code_properties: int

  @property
  def granulated_vgprs(self) -> int: return self.compute_pgm_rsrc1 & 0x3F             # GRANULATED_WORKITEM_VGPR_COUNT
  @property
  def wave32(self) -> bool: return bool(self.kernel_code_properties >> 10 & 1)       # ENABLE_WAVEFRONT_SIZE32
  @property
  def uses_kernarg_ptr(self) -> bool: return bool(self.kernel_code_properties >> 3 & 1)  # ENABLE_SGPR_KERNARG_SEGMENT_PTR


class CodeObject:
  """A parsed AMDGPU code object: `arch`, `sections`, `symbols`, `metadata` (the decoded note) and per-kernel views."""
  def __init__(self, data: bytes):
    self.data = data
    if len(data) < 64 or data[:4] != b"\x7fELF": raise ELFError("not an ELF file")
    if data[4] != 2 or data[5] != 1: raise ELFError("not a little-endian ELF64 file")
    self.osabi, self.abi_version = data[7], data[8]
    (self.type, self.machine, _, _, _, shoff, self.flags, _, _, _, shentsize, shnum, shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", data, 16)
    if self.machine != EM_AMDGPU: raise ELFError(f"e_machine is {self.machine}, not EM_AMDGPU ({EM_AMDGPU})")
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + k * shentsize) for k in range(shnum)]
    names = raw[shstrndx] if shnum else None
    def strz(sec_off: int, off: int) -> str:
      end = data.index(b"\0", sec_off + off)
      return data[sec_off + off:end].decode()
    self.sections = [Section(strz(names[4], r[0]) if names else "", r[1], r[4], r[5], r[3], r[6], r[9]) for r in raw]
    self.symbols: list[Symbol] = []
    for s in self.sections:
      if s.type not in (SHT_SYMTAB, SHT_DYNSYM) or s.entsize == 0: continue
      strtab = self.sections[s.link]
      for k in range(1, s.size // s.entsize):  # entry 0 is the null symbol
        name, info, _, shndx, value, size = struct.unpack_from("<IBBHQQ", data, s.offset + k * s.entsize)
        sym = Symbol(strz(strtab.offset, name), info & 0xF, info >> 4, shndx, value, size)
        if sym not in self.symbols: self.symbols.append(sym)
    self.metadata: dict[str, Any] = {}
    for s in self.sections:
      if s.type != SHT_NOTE: continue
      off, end = s.offset, s.offset + s.size
      while off + 12 <= end:
        namesz, descsz, ntype = struct.unpack_from("<III", data, off)
        name = data[off + 12:off + 12 + namesz].rstrip(b"\0").decode(errors="replace")
        desc_off = off + 12 + (namesz + 3) // 4 * 4
        if name == "AMDGPU" and ntype == NT_AMDGPU_METADATA: self.metadata = unpack_msgpack(data[desc_off:desc_off + descsz])
        off = desc_off + (descsz + 3) // 4 * 4

  @property
  def arch(self) -> str | None: return MACH.get(self.flags & EF_AMDGPU_MACH)

  def symbol(self, name: str) -> Symbol:
    for s in self.symbols:
      if s.name == name: return s
    raise ELFError(f"no symbol {name!r}; the code object has {sorted({s.name for s in self.symbols})}")

  def kernels(self) -> dict[str, dict[str, Any]]:
    """The metadata of each kernel by name (`.name`, `.symbol`, `.args`, `.kernarg_segment_size`, `.vgpr_count`, ...)."""
    return {k[".name"]: k for k in self.metadata.get("amdhsa.kernels", [])}

  def descriptor(self, kernel: str) -> KernelDescriptor:
    """The kernel descriptor at the symbol `KERNEL.kd` (its file offset found through the section holding it)."""
    sym = self.symbol(f"{kernel}.kd")
    sec = self.sections[sym.section]
    off = sec.offset + (sym.value - sec.addr)
    if sym.size != 64 or off + 64 > len(self.data): raise ELFError(f"{kernel}.kd is not a 64-byte kernel descriptor")
    g, p, ka, _, entry = struct.unpack_from("<IIIIq", self.data, off)
    rsrc3, rsrc1, rsrc2, props = struct.unpack_from("<IIIH", self.data, off + 44)
    return KernelDescriptor(g, p, ka, entry, rsrc3, rsrc1, rsrc2, props)


def describe(data: bytes) -> str:
  """One line per kernel: name, arch, wave size, registers and kernarg bytes (for logs and DEBUG output)."""
  co = CodeObject(data)
  out = []
  for name, k in co.kernels().items():
    out.append(f"{name}: {co.arch or hex(co.flags & EF_AMDGPU_MACH)} wave{k.get('.wavefront_size')} vgpr {k.get('.vgpr_count')} "
               f"sgpr {k.get('.sgpr_count')} lds {k.get('.group_segment_fixed_size')} kernarg {k.get('.kernarg_segment_size')}")
  return "\n".join(out)
