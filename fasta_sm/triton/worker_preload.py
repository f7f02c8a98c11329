"""Imported once by the compile workers' fork server, so that every worker it forks inherits the work.

Triton keys its cache with a hash of its own shared library (about 500 MB),
computed once per process: 0.4 s on a quiet core, more when fourteen fresh
workers read the same file at once. Hashed here, before the server forks,
it costs each worker nothing. Nothing here touches a device: forking after
CUDA is initialised is unsafe, forking after hashing a file is not.
"""

from .compile_pool import warm_triton_key

warm_triton_key()
