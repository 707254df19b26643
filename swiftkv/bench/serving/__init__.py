"""Serving benchmarks: the same workloads through two engines, results as JSON.

- ``hf``: batched ``generate()`` of transformers with the SwiftKV prefill skip (``swiftkv.bench.serving.hf``);
- ``vllm``: the engine's own benchmark commands (``vllm bench throughput``, ``vllm serve`` + ``vllm bench serve``)
  run as subprocesses in vLLM's own environment (``swiftkv.bench.serving.vllm``).

Studies (paper section 4.2): ``throughput`` (combined tokens/s vs input length, Fig. 3), ``latency`` (TTFT and TPOT
vs request rate, Fig. 4), ``kv-limit`` (throughput under KV-cache memory limits, Table 3) and ``sharegpt``
(real prompts filtered by input/output ratio, Table A.3). Workloads are built in ``swiftkv.bench.serving.workloads``,
variants (base, SwiftKV, AcrossKV, plugin-served checkpoints) are described by ``swiftkv.bench.serving.variants``.
"""

STUDIES = ("throughput", "latency", "kv-limit", "sharegpt")
ENGINES = ("hf", "vllm")
