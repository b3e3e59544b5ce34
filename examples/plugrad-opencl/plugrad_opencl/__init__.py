"""plugrad-opencl: an OpenCL backend for plugrad (device OPENCL), written against the public backend contract only."""
