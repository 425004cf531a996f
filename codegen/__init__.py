"""Code generation: kernel descriptions and their C/CUDA renderers
(render.py) and the generator of each lg op (generators.py), shared by the
plan-codegen pass and the runtime's generated host kernels."""
