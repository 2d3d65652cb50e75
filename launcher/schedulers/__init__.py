"""How a job is started and followed: one scheduler class per `cluster.scheduler` (launcher/schedulers/registry.py)."""
