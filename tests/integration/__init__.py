"""Integration tests: a real tritonserver, the local Slurm cluster, MPI, engine processes."""
