"""Stand-in: vllm.v1.metrics.loggers.StatLoggerBase (the abstract methods a stat logger of vLLM 0.25 defines)."""

from abc import ABC, abstractmethod


class StatLoggerBase(ABC):
    @abstractmethod
    def __init__(self, vllm_config, engine_index: int = 0): ...

    @abstractmethod
    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0): ...

    @abstractmethod
    def log_engine_initialized(self): ...

    def log(self):  # noqa: B027 - vLLM's default does nothing
        pass
