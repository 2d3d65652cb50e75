"""The benchmarks that need a GPU, run on a lent GPU machine (benchmark/README.md says how); benchmark/gpu/carry
brings the packages they need to a machine that cannot download."""
