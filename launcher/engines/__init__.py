"""The engines llmlaunch serves, one package each (base.py says what an engine is, registry.py which there are).

base.py      Engine (the base class: facts, hooks), RenderedModel, triton_entry and the helpers engines share
config.py    EngineConfig: the settings every engine has
registry.py  ENGINES: name -> Engine, the built-in packages and those registered from other distributions
ray.py       a per-copy Ray cluster for a model copy over several nodes (vLLM, LMDeploy's PyTorch backend)
hf/ vllm/ sglang/ lmdeploy/ trtllm/   one engine each: __init__.py (its Engine), config.py, the Triton model(s)
"""
