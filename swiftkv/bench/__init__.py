"""Measurement machinery, apart from the core library: what the benchmarks and the report page need.

- ``speed``: prefill forward time and distillation-step throughput, base vs SwiftKV in one process;
- ``serving``: the serving studies (throughput, latency, KV-limited, ShareGPT) on two engines, transformers
  ``generate()`` and vLLM (``serving.vllm``);
- ``vllm_throughput``: vLLM's own ``bench throughput`` per checkpoint with the plugin, and its KV-cache capacity;
- ``provenance``: git commit, hardware and library versions, artefact dates for the report page.

Nothing here is imported by the core (models, conversion, distillation, evaluation).
"""
