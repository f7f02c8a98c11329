import os

fasta_autotune = os.environ.get("FASTAUTOTUNE", "0") == "1"
num_vector_core = 48  # the device's, unless NPU_DEVICE_LIMIT lowers it
