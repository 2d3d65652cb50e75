"""llmlaunch: put LLM inference servers (Triton python backend) on Slurm/HPC clusters and measure them."""

__version__ = "0.1.0"
