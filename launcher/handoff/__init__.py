"""Typed hand-offs between llmlaunch's processes: what one process writes and another reads, declared once.

rank_env.py   `RankEnv`: the environment variables the launcher hands a rank, and a rank its server, the engine
              process and its own child services (`_LLMLAUNCH_*`, LLMLAUNCH_RUN_DIR)
endpoint.py   `EndpointRecord`: endpoint.json, what rank 0 publishes once the job serves

Every layer uses these (the launching side, the ranks, the servers' python models), so this package imports nothing
from launcher but launcher.errors.
"""
