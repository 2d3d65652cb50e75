"""Process helpers the launcher's long-running pieces share, below all of them: nothing here imports anything of
launcher/ outside this package, so launcher/rank, launcher/triton.py, launcher/frontend and launcher/openai_api can
all use it without importing each other.

group.py   process groups: SIGTERM when the parent dies, stopping a group, ending what is left of one
drain.py   the time limit's drain, as the rank and its children agree on it
config.py  a child service's config as data: one dataclass, written as JSON by the parent and read back, strictly
child.py   a supervised child service (the front end, the OpenAI API): the parent's handle and the child's side
"""
