"""`Runtime`: loads compiled PROGRAMs of one device into launchable programs, and waits for the device."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
  from plugrad.uop.ops import UOp

# What a runtime can do, read by the conformance suite to pick tests (never the device name):
#   run: launches kernels; transfer: device-to-device copies; timing: `wait=True` gives device time; graph: not read (graph
#   support is what the plugrad_graph hook answers: `CompiledDevice.graph`)
CAPABILITIES = frozenset({"run", "graph", "transfer", "timing"})

Dims = tuple[int, int, int]


class LoadedProgram(Protocol):
  """A kernel ready to launch. Handles come in slot order (`program.globals`), `vals` in `program.vars` order.
  With `wait`, it blocks until the kernel is done and returns the seconds it took; otherwise it may return None at once."""
  def __call__(self, *handles: Any, global_size: Dims = (1, 1, 1), local_size: Dims = (1, 1, 1), vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None: ...


class Runtime:
  """Subclasses implement `load(program)` and, for asynchronous devices, `synchronize()`. `device` is the canonical name."""
  capabilities: frozenset[str] = frozenset({"run"})

  def __init__(self, device: str):
    if not isinstance(device, str) or not device: raise TypeError(f"{type(self).__name__} needs the device name as a non-empty str, got {device!r}")
    self.device = device

  def __init_subclass__(cls, **kwargs: Any) -> None:
    super().__init_subclass__(**kwargs)
    if not isinstance(cls.capabilities, frozenset) or not cls.capabilities <= CAPABILITIES:
      raise TypeError(f"{cls.__name__}.capabilities must be a frozenset of {sorted(CAPABILITIES)}, got {cls.capabilities!r}")

  def __repr__(self) -> str: return f"<{type(self).__name__} {self.device}>"

  def load(self, program: UOp) -> LoadedProgram:
    """A launchable program from a PROGRAM UOp at the BINARY stage (`program.binary`, `program.name`, ...)."""
    raise NotImplementedError(f"{type(self).__name__} must implement load(program) -> LoadedProgram")

  def describe(self) -> str:
    """The hardware this runtime drives, in a few words for listings (`python -m plugrad devices` prints it after a
    passing smoke test), e.g. an adapter's name and driver; "" when there is nothing to add to the device's description."""
    return ""

  def synchronize(self) -> None:
    """Wait until everything launched on this device is done (a no-op for synchronous devices)."""
