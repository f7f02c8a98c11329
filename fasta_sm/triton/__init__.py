"""Live Triton: the parallel-compile backend, the recorder and the `autotune` drop-in.

Nothing here is imported by `import fasta_sm`: each module imports torch and
Triton itself, so the core stays usable without them.
"""
