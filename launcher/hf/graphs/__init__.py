"""CUDA graphs of the `hf` engine's steps: one abstraction, four families.

Why graphs: a step run eagerly is kernel launches from Python (a decode step of a 1 B model launches ~20 kernels
per layer; on the H100 host that cost ~15 ms per step whatever the batch, the GPU idle).  Replaying a captured graph
launches them all at once.  A graph has static shapes, so a step is padded to a bucket; padded tokens write their
keys/values through the spare slot (slot max_num_seqs), whose block table is all the null block nobody reads, and
their logits are dropped.  A graph reads the runner's block tables (one device tensor, updated in place before each
step), so the blocks a sequence holds need no graph of their own.

A `GraphFamily` (family.py) is one kind of step with its graphs: which shapes it captures (its `capture_all`), the
static input buffers of one shape (`buffers`: `meta`, the per-token rows a replay fills in, and `keep`, the token rows
whose logits come out), the padded step a graph holds (`body`: everything computed from the buffers, so a replay sees
the new step), when a step replays one of its graphs (`key_for`), and how a step's inputs go in (`load`) and its
logits come out (`outputs`).  Capture, replay and what a failed capture turns off are shared there; each family is a
module of its own, as each pads its steps its own way:

* decode.py, DecodeGraphs: decode-only steps;
* prompt.py, PromptGraphs: steps of one whole prompt, and WaveGraphs: steps of several (they share the prompt-graph
  limit);
* mixed.py, MixedGraphs: decode rows and whole prompts in one step;
* buckets.py: the padded sizes the prompt and mixed graphs are captured at, and the runner's limits on them.

Every graph of a runner shares one memory pool (they replay one at a time), and is captured at start (`warm_up`),
so that serving never stalls on a capture (~0.1 s each, and a capture mid-run delays every running request).

tp > 1: a graph holds the layers' NCCL all-reduces, so each rank's replay meets its peers' replays of the same
graph.  Every rank captures the same buckets in the same order in `warm_up` (the leader's plan) and picks graph or
eager for a step by the same rule (HFModelRunner._replay, from the broadcast StepInputs alone); a capture that fails
is fatal there (a rank falling back to eager steps alone would hang its peers).
"""
