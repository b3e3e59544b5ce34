"""plugrad-metal: the METAL device of plugrad (Metal Shading Language with simdgroup-matrix tensor cores, a Metal
runtime through pyobjc, an indirect-command-buffer graph runner for TinyJit). Registration is in
`plugrad_metal.plugin`; nothing is imported here."""
__version__ = "0.1.0"
