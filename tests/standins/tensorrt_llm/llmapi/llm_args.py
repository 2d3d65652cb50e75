"""Stand-in: tensorrt_llm.llmapi.llm_args. The real TorchLlmArgs / TrtLlmArgs are pydantic models whose
fields are tensorrt_llm.LLM's keyword arguments (llmlaunch reads `model_fields`); these carry a subset of
the real field names, enough to tell a known key from an unknown one."""

_BASE = (
    "model",
    "tokenizer",
    "tokenizer_mode",
    "skip_tokenizer_init",
    "trust_remote_code",
    "tensor_parallel_size",
    "dtype",
    "revision",
    "tokenizer_revision",
    "pipeline_parallel_size",
    "context_parallel_size",
    "gpus_per_node",
    "moe_cluster_parallel_size",
    "moe_tensor_parallel_size",
    "moe_expert_parallel_size",
    "enable_attention_dp",
    "cp_config",
    "load_format",
    "enable_lora",
    "lora_config",
    "kv_cache_config",
    "enable_chunked_prefill",
    "guided_decoding_backend",
    "batched_logits_processor",
    "iter_stats_max_iterations",
    "request_stats_max_iterations",
    "peft_cache_config",
    "scheduler_config",
    "cache_transceiver_config",
    "speculative_config",
    "max_batch_size",
    "max_input_len",
    "max_seq_len",
    "max_beam_width",
    "max_num_tokens",
    "gather_generation_logits",
    "num_postprocess_workers",
    "postprocess_tokenizer_dir",
    "reasoning_parser",
    "garbage_collection_gen0_threshold",
    "return_perf_metrics",
)


class _Fields:
    model_fields: dict = {}


class TorchLlmArgs(_Fields):
    model_fields = {
        name: None
        for name in _BASE
        + (
            "build_config",
            "cuda_graph_config",
            "disable_overlap_scheduler",
            "moe_config",
            "attn_backend",
            "sampler_type",
            "enable_iter_perf_stats",
            "print_iter_log",
            "torch_compile_config",
            "enable_autotuner",
            "stream_interval",
            "checkpoint_format",
        )
    }


class TrtLlmArgs(_Fields):
    model_fields = {
        name: None
        for name in _BASE
        + (
            "build_config",
            "workspace",
            "enable_build_cache",
            "extended_runtime_perf_knob_config",
            "calib_config",
            "quant_config",
            "embedding_parallel_mode",
            "fast_build",
        )
    }
