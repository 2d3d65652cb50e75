"""Unit tests: no tritonserver, no Slurm, no server processes; the whole folder runs in seconds."""
