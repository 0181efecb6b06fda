"""GPU kernels in Triton, checked on CPU tensors under Triton's interpreter.

Set ``TRITON_INTERPRET=1`` in the environment before this package is first
imported to run the kernels on CPU tensors (the interpreter reads it when a
kernel is defined); on CUDA tensors without it they compile for the GPU.
Needs the ``triton`` package (``scripts/install.sh`` installs it).
"""
