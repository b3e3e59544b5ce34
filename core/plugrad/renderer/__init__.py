"""Renderers: linear programs to source text. `Renderer` is the base every backend subclasses."""
from plugrad.renderer.base import CAPABILITIES, Renderer, RendererError
from plugrad.renderer.tensor_cores import TensorCore, find_tensor_core

__all__ = ["CAPABILITIES", "Renderer", "RendererError", "TensorCore", "find_tensor_core"]
