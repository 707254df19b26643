"""The latency study of the vLLM engine (paper Fig. 4): one ``vllm serve`` per variant, all started together, then
per variant in turn ``vllm bench serve --request-rate R`` for each rate (Poisson arrivals), with per-request TTFT
and TPOT kept (``--save-detailed``). A mixin of ``swiftkv.bench.serving.vllm.VllmEngine``: it uses the engine's
servers, settings and runs."""

from __future__ import annotations

import contextlib
import json
import logging
import statistics

logger = logging.getLogger(__name__)


class LatencyStudy:
    """TTFT / TPOT against request rate; needs the engine's ``specs``, ``skipped``, ``reference``, ``settings``,
    ``workdir``, ``_start_server``, ``_ready``, ``model_of``, ``_len`` and ``_run``."""

    def latency(self, input_len: int, output_len: int, num_requests: int, rates: list[float]) -> list[dict]:
        max_len = self._len(input_len + output_len)
        raw: dict[str, dict[float, dict] | str] = {}
        names = [n for n in self.specs if n not in self.skipped]
        with contextlib.ExitStack() as stack:  # every server started at once (their start-ups overlap), then each
            started = {n: self._start_server(stack, self.specs[n], max_len, f"latency/{n}") for n in names}
            for name in names:  # measured in turn while the others idle
                spec, raw[name] = self.specs[name], {}
                try:
                    url = self._ready(*started[name])
                    for rate in rates:
                        raw[name][rate] = self._bench_serve(spec, url, input_len, output_len, num_requests, rate,
                                                            f"latency/{name}/rate{rate}")
                except RuntimeError as err:
                    logger.error("%s", err)
                    raw[name] = str(err)
        rows = []
        for rate in rates:
            point = []
            for name, spec in self.specs.items():
                row = {"variant": name, "label": spec.label or name, "request_rate": rate, "input_len": input_len,
                       "output_len": output_len, "num_requests": num_requests,
                       "num_key_value_layers": spec.num_key_value_layers}
                res = raw.get(name)
                if name in self.skipped or isinstance(res, str):
                    row.update(status="not_measured", reason=self.skipped.get(name) or res)
                else:
                    r = res[rate]
                    row.update({k: r.get(k) for k in ("median_ttft_ms", "mean_ttft_ms", "p90_ttft_ms",
                                                      "median_tpot_ms", "mean_tpot_ms", "p90_tpot_ms",
                                                      "median_e2el_ms", "duration", "completed", "failed")})
                    row["throughput_tok_s"] = r.get("total_token_throughput")
                    row["duration_s"] = row.pop("duration")
                    row.update(per_request_latency(r))
                point.append(row)
            ref = next((p for p in point if p["variant"] == self.reference and p.get("median_ttft_ms")), None)
            for r in point:
                for m in ("ttft", "tpot"):
                    ok = ref and r.get(f"median_{m}_ms")
                    r[f"{m}_speedup"] = ref[f"median_{m}_ms"] / r[f"median_{m}_ms"] if ok else None
            rows += point
        return rows

    def _bench_serve(self, spec, url, input_len, output_len, num_requests, rate, tag) -> dict:
        out = self.workdir / f"{tag}.json"
        cmd = [*self.settings.command, "bench", "serve", "--backend", "vllm", "--base-url", url,
               "--model", self.model_of(spec), "--dataset-name", "random", "--random-input-len", str(input_len),
               "--random-output-len", str(output_len), "--random-range-ratio", "0", "--ignore-eos",
               "--num-prompts", str(num_requests), "--request-rate", str(rate), "--seed", str(self.settings.seed),
               "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
               "--save-result", "--save-detailed", "--result-dir", str(out.parent), "--result-filename", out.name]
        if self.settings.warmup:
            cmd += ["--num-warmups", str(self.settings.warmup)]
        self._run(cmd, spec, tag)
        return json.loads(out.read_text())


def per_request_latency(result: dict) -> dict:
    """Per request, in the benchmark's request order, from a ``vllm bench serve --save-detailed`` result: TTFT and
    TPOT (the mean gap between output tokens) in ms; empty lists where the result has no per-request detail."""
    ttfts, itls = result.get("ttfts") or [], result.get("itls") or []
    return {"ttft_ms": [round(t * 1e3, 3) for t in ttfts],
            "tpot_ms": [round(statistics.mean(gaps) * 1e3, 3) if gaps else None for gaps in itls]}
