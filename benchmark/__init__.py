"""llmlaunch's benchmarks: scripts that measure the product and print figures (docs/performance/ holds the
tables they fill, docs/performance.md sums them up; benchmark/README.md indexes them).

Each script runs as a module from the checkout's root, `python -m benchmark.<name>` (benchmark/gpu: `python -m
benchmark.gpu.<name>`), so that it imports this checkout's `launcher` and its sibling modules without touching
`sys.path`.  Servers are started and stopped through benchmark/servers.py.
"""
