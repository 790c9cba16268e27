"""The C kernels and their thin ctypes wrappers: each C source here is compiled once per machine
(build.py), or once per image ahead of time (`pdserve kernels`), for the target of target.py, and
loaded through loader.py, which logs a kernel that cannot be had, once, and hands its caller the
reason. Imports nothing of the project: the wrappers take tensors and addresses."""
