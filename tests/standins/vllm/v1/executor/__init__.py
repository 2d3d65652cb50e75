"""Stand-in: vllm.v1.executor.Executor (only get_class, which the engine-core launch takes)."""


class Executor:
    @staticmethod
    def get_class(vllm_config):
        return Executor
