"""A stand-in for the vLLM CLI (tests only): answers the commands the serving driver uses, instantly.

``bench throughput`` writes a result JSON; ``serve`` answers /health on 127.0.0.1 and starts a child process, and
records both pids in $FAKE_VLLM_PIDS (a KV cache below 1000 bytes fails like vLLM does), and its /metrics says how
many requests it runs (as many as the cache holds); ``bench serve`` writes a result with throughput and latency
fields. SwiftKV model directories get 1.5x the base throughput.
"""

import http.server
import json
import os
import subprocess
import sys
import time
import urllib.request


def opt(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def main(argv):
    if argv[:1] == ["--version"]:
        print("0.0-fake")
        return 0
    if argv[:2] == ["bench", "throughput"]:
        print("INFO Initializing a V1 LLM engine (v0.0-fake) with config: ...", flush=True)
        model = opt(argv, "--model")
        if int(opt(argv, "--kv-cache-memory-bytes", "1000000")) < 1000:
            print("ValueError: the KV cache cannot hold one request", flush=True)
            return 1
        n = int(opt(argv, "--num-prompts"))
        if opt(argv, "--dataset-path"):
            data = json.load(open(opt(argv, "--dataset-path")))
            tokens = sum(len(c["conversations"][0]["value"].split()) + len(c["conversations"][1]["value"].split())
                         for c in data)
        else:
            tokens = n * (int(opt(argv, "--random-input-len")) + int(opt(argv, "--random-output-len")))
        tps = 1500.0 if "swiftkv" in model else 1000.0
        json.dump({"elapsed_time": tokens / tps, "num_requests": n, "total_num_tokens": tokens,
                   "requests_per_second": n * tps / tokens, "tokens_per_second": tps},
                  open(opt(argv, "--output-json"), "w"))
        return 0
    if argv[:1] == ["serve"]:
        print("INFO Initializing a V1 LLM engine (v0.0-fake) with config: ...", flush=True)
        if int(opt(argv, "--kv-cache-memory-bytes", "1000000")) < 1000:
            print("ValueError: the KV cache cannot hold one request", flush=True)
            return 1
        print("INFO KV cache size: 4,096 tokens, Maximum concurrency for 64 tokens per request: 64.00x", flush=True)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        if os.environ.get("FAKE_VLLM_PIDS"):
            with open(os.environ["FAKE_VLLM_PIDS"], "a") as f:
                f.write(f"{os.getpid()} {child.pid}\n")

        # /metrics: the running-requests gauge, as many as the cache holds at 1,000 bytes a request (1.5x for an
        # AcrossKV model: its cache holds fewer layers), at most 8
        per_request = 1000 / (1.5 if "acrosskv" in argv[1] else 1)
        running = min(8, int(int(opt(argv, "--kv-cache-memory-bytes", "1000000")) // per_request))
        metrics = ("# TYPE vllm:num_requests_running gauge\n"
                   f'vllm:num_requests_running{{engine="0",model_name="{argv[1]}"}} {running}.0\n'
                   f'vllm:num_requests_waiting{{engine="0",model_name="{argv[1]}"}} 0.0\n').encode()

        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = metrics if self.path == "/metrics" else b""
                self.send_response(200 if self.path in ("/health", "/metrics") else 404)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        http.server.HTTPServer((opt(argv, "--host"), int(opt(argv, "--port"))), Health).serve_forever()
    if argv[:2] == ["bench", "serve"]:
        assert urllib.request.urlopen(opt(argv, "--base-url") + "/health").status == 200
        rate = float(opt(argv, "--request-rate"))
        time.sleep(float(os.environ.get("FAKE_VLLM_BENCH_SLEEP", "0")))
        out = os.path.join(opt(argv, "--result-dir"), opt(argv, "--result-filename"))
        n = int(opt(argv, "--num-prompts"))
        if opt(argv, "--dataset-path"):
            data = json.load(open(opt(argv, "--dataset-path")))
            inputs = sum(len(c["conversations"][0]["value"].split()) for c in data)
            outputs = sum(len(c["conversations"][1]["value"].split()) for c in data)
        else:
            inputs, outputs = n * int(opt(argv, "--random-input-len")), n * int(opt(argv, "--random-output-len"))
        tps = 1500.0 if "swiftkv" in opt(argv, "--model") else 1000.0  # what the throughput rounds read
        result = {"median_ttft_ms": 100 + 10 * rate, "mean_ttft_ms": 110.0, "p90_ttft_ms": 150.0,
                  "median_tpot_ms": 10.0, "mean_tpot_ms": 11.0, "p90_tpot_ms": 12.0, "median_e2el_ms": 500.0,
                  "duration": (inputs + outputs) / tps, "completed": n, "failed": 0, "total_token_throughput": tps,
                  "total_input_tokens": inputs, "total_output_tokens": outputs,
                  "request_throughput": n * tps / (inputs + outputs)}
        if "--save-detailed" in argv:  # per request: TTFT (s), inter-token gaps (s)
            result.update(ttfts=[(100 + 10 * rate + i) / 1e3 for i in range(n)], itls=[[0.01, 0.012]] * n,
                          generated_texts=["x"] * n)
        json.dump(result, open(out, "w"))
        return 0
    print(f"fake vllm: unknown command {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
