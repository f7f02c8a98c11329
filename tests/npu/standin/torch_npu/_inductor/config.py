import os

fasta_autotune = os.environ.get("FASTAUTOTUNE", "0") == "1"
