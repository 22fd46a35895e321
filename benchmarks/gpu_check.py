"""What only a GPU shows: NVML telemetry during probes, and GPU evidence in a verdict.

Starts a GPU-resident generation server of its own (a random-weight Llama of a
realistic size, batched `generate` on the GPU behind a small OpenAI-compatible HTTP
front with vLLM-style /metrics), then runs `autotune diagnose --base-url` against it
twice: with the server batching at most 4 requests (the high probe queues: the GPU
is the limit) and at most 64 (it batches everything: parallelism is the limit). For
each probe it prints autotune's NVML readings (utilisation, memory, power) beside an
independent `nvidia-smi` reading of the same window and the server's own count of
the memory PyTorch holds, then the verdict and whether GPU evidence was cited.

    python benchmarks/gpu_check.py                   # on a GPU machine (H100/H200)
    python benchmarks/gpu_check.py --device cpu --tiny  # the same flow, no GPU

Needs torch and transformers (and autotune's own dependencies); nothing is downloaded.
Writes gpu_check.json to --out (default $OUT, else reports/gpu_check).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VOCAB = 32000
BYTES_PER_TOKEN = 4  # the stand-in tokenizer's rate, about a real one's on English
GATHER_S = 0.02  # how long a batch waits for more requests after its first
# A 23B-parameter shape (47 GB in bf16; a Llama-70B layer, 24 of them): each decode step
# reads all the weights in few, large kernels, so the GPU, not Python launching kernels,
# sets the pace, and NVML's utilisation means something.
FULL = {"hidden": 8192, "intermediate": 28672, "layers": 24, "heads": 64}
TINY = {"hidden": 64, "intermediate": 128, "layers": 2, "heads": 2}
PROBES = ["--low", "4", "--high", "16", "--min-s", "4", "--max-s", "15", "--no-stream"]
WORKLOAD = ["--synthetic", "400", "--prompt-tokens", "256,0", "--output-tokens", "64,0"]
CASES = (("gpu-bound", 4), ("batching", 64))  # (name, the server's max batch)


# -- the server --------------------------------------------------------------------------


class Generator:
    """Static batching: up to `max_batch` waiting requests share one `generate` call."""

    def __init__(self, shape: dict[str, int], device: str, max_batch: int) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        self.torch = torch
        self.device = device
        self.max_batch = max_batch
        config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=shape["hidden"],
            intermediate_size=shape["intermediate"],
            num_hidden_layers=shape["layers"],
            num_attention_heads=shape["heads"],
            num_key_value_heads=shape["heads"],
            max_position_embeddings=4096,
        )
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        torch.manual_seed(0)
        torch.set_default_dtype(dtype)
        with torch.device(device):  # built where it runs: no host copy of the weights
            self.model = LlamaForCausalLM(config).eval()
        self.queue: asyncio.Queue[tuple[list[int], int, asyncio.Future[list[int]]]] = (
            asyncio.Queue()
        )
        self.running = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self._prompt_seen = False
        # One thread runs every generate call, so CUDA and cuBLAS state are made once.
        self.executor = ThreadPoolExecutor(max_workers=1)

    async def warm_up(self) -> None:
        """Batches of the probes' shapes through the serving thread, before measuring."""
        loop = asyncio.get_running_loop()
        prompt = encode("lorem ipsum " * 86)  # ~256 tokens, as the check's workload
        for batch in (4, 4, 16, 16):
            await loop.run_in_executor(self.executor, self.generate, [prompt] * batch, 64)
        self.prompt_tokens = self.generation_tokens = 0

    def put(self, tokens: Any) -> None:
        """generate's streamer hook: the prompt first, then one token per sequence a step,
        so the generated-token counter moves step by step, as vLLM's does."""
        if self._prompt_seen:
            self.generation_tokens += int(tokens.shape[0])
        self._prompt_seen = True

    def end(self) -> None:
        self._prompt_seen = False

    def generate(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        torch = self.torch
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):  # left padding, as generate expects
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
                streamer=self,
            )
        return out[:, width:].tolist()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            deadline = loop.time() + GATHER_S  # the client resubmits a batch's worth at once
            while len(batch) < self.max_batch:
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), deadline - loop.time()))
                except TimeoutError:
                    break
            self.running = len(batch)
            self.prompt_tokens += sum(len(p) for p, _, _ in batch)
            new_tokens = max(n for _, n, _ in batch)
            try:
                outputs = await loop.run_in_executor(
                    self.executor, self.generate, [p for p, _, _ in batch], new_tokens
                )
            except Exception as error:  # an OOM fails this batch, not the server
                for _, _, future in batch:
                    future.set_exception(error)
                continue
            finally:
                self.running = 0
            for (_, n, future), tokens in zip(batch, outputs, strict=True):
                future.set_result(tokens[:n])

    def metrics(self) -> str:
        lines = [
            f"vllm:num_requests_running {self.running}",
            f"vllm:num_requests_waiting {self.queue.qsize()}",
            f"vllm:prompt_tokens_total {self.prompt_tokens}",
            f"vllm:generation_tokens_total {self.generation_tokens}",
        ]
        if self.device == "cuda":
            reserved = self.torch.cuda.max_memory_reserved()
            lines.append(f"gpu_check:torch_reserved_bytes {reserved}")
        return "\n".join(lines) + "\n"


def encode(text: str) -> list[int]:
    """A stand-in tokenizer: one token per 4 bytes (the weights are random anyway)."""
    data = text.encode()
    chunks = [data[i : i + BYTES_PER_TOKEN] for i in range(0, len(data), BYTES_PER_TOKEN)]
    return [3 + int.from_bytes(chunk, "little") % (VOCAB - 3) for chunk in chunks] or [3]


def decode(tokens: list[int]) -> str:
    return "".join(chr(32 + t % 95) for t in tokens)


async def serve(args: argparse.Namespace) -> None:
    from aiohttp import web

    started = time.perf_counter()
    generator = Generator(TINY if args.tiny else FULL, args.device, args.max_batch)
    await generator.warm_up()
    params = sum(p.numel() for p in generator.model.parameters())
    print(
        f"model: {params / 1e9:.2f}B parameters on {args.device} "
        f"in {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    model_name = f"random-llama-{params / 1e9:.1f}b"

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("stream"):
            return web.json_response({"error": "streaming is not served here"}, status=400)
        chat = "messages" in body
        text = (
            "\n".join(str(m.get("content") or "") for m in body["messages"])
            if chat
            else str(body.get("prompt", ""))
        )
        prompt = encode(text)
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        await generator.queue.put((prompt, int(body.get("max_tokens") or 16), future))
        tokens = await future
        output = decode(tokens)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        choice.update(
            {"message": {"role": "assistant", "content": output}} if chat else {"text": output}
        )
        return web.json_response(
            {
                "id": f"cmpl-{id(future)}",
                "object": "chat.completion" if chat else "text_completion",
                "model": model_name,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(tokens),
                    "total_tokens": len(prompt) + len(tokens),
                },
            }
        )

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model_name}]})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=generator.metrics())

    async def configure(request: web.Request) -> web.Response:
        generator.max_batch = int((await request.json())["max_batch"])
        return web.json_response({"max_batch": generator.max_batch})

    app = web.Application()
    app.add_routes(
        [
            web.post("/v1/completions", completions),
            web.post("/v1/chat/completions", completions),
            web.get("/v1/models", models),
            web.get("/health", health),
            web.get("/metrics", metrics),
            web.post("/config", configure),
        ]
    )
    batcher = asyncio.create_task(generator.run())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()
    print(f"listening on {args.port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        batcher.cancel()
        await runner.cleanup()


# -- the check ---------------------------------------------------------------------------

Reading = tuple[float, float, float, float]  # epoch s, util %, memory GiB, power W


def smi_readings(text: str) -> list[Reading]:
    """nvidia-smi's CSV lines; it stamps local wall-clock time, made epoch seconds here."""
    readings = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            stamp, _, fraction = parts[0].partition(".")
            when = time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S"))
            when += float(f"0.{fraction or 0}")
            readings.append((when, float(parts[1]), float(parts[2]) / 1024, float(parts[3])))
        except (ValueError, IndexError):
            continue
    return readings


def probe_summary(probe: dict[str, Any], smi: list[Reading]) -> dict[str, Any]:
    """autotune's NVML readings over one probe's steady state, beside nvidia-smi's."""
    series = probe["series"]
    start = (min(s["t"] for s in series) if series else 0.0) + probe["warmup_s"]
    end = start + probe["measured_s"]
    gpu = [s for s in series if s["source"] == "gpu" and start <= s["t"] <= end]

    def stat(key: str) -> dict[str, float] | None:
        values = [s[key] for s in gpu if key in s]
        if not values:
            return None
        return {"mean": sum(values) / len(values), "max": max(values)}

    inside = [r for r in smi if start <= r[0] <= end]
    smi_means = (
        {
            name: sum(r[i] for r in inside) / len(inside)
            for i, name in enumerate(("util_pct", "memory_gib", "power_w"), start=1)
        }
        if inside
        else None
    )
    return {
        "parallelism": probe["parallelism"],
        "rollouts_per_s": probe["rollouts_per_s"],
        "output_tokens_per_s": probe["output_tokens_per_s"],
        "nvml_samples": len(gpu),
        "util_pct": stat("gpu_util_pct_mean"),
        "memory_gib": stat("gpu_mem_used_gib_total"),
        "power_w": stat("gpu_power_w_total"),
        "nvidia_smi": smi_means,
        "nvidia_smi_samples": len(inside),
        "telemetry_unavailable": probe["telemetry_unavailable"],
    }


def fmt(stat: dict[str, float] | None, unit: str) -> str:
    return "-" if stat is None else f"{stat['mean']:.1f} {unit} (max {stat['max']:.1f})"


def run_diagnose(base_url: str, out: Path) -> dict[str, Any]:
    """`autotune diagnose --base-url`, as a user runs it."""
    path = out / "diagnose.json"
    command = [
        *(sys.executable, "-m", "autotune", "diagnose", "--base-url", base_url),
        *PROBES,
        *WORKLOAD,
        *("--output-dir", str(out)),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"autotune diagnose failed:\n{done.stderr}")
    print(done.stdout, flush=True)
    return dict(json.loads(path.read_text()))


async def server_call(url: str, payload: dict[str, Any] | None = None) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        method = session.post(url, json=payload) if payload is not None else session.get(url)
        async with method as response:
            return await response.text()


async def check(args: argparse.Namespace) -> int:
    from autotune.servers.launcher import ServerSpec, free_port

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    root = f"http://127.0.0.1:{port}"
    command = [sys.executable, __file__, "serve", "--port", str(port), "--device", args.device]
    smi = None
    smi_log = out / "nvidia_smi.csv"
    if shutil.which("nvidia-smi"):  # an independent reading of the same counters
        with smi_log.open("w") as log:
            smi = subprocess.Popen(
                [
                    *("nvidia-smi", "--format=csv,noheader,nounits", "-lms", "250"),
                    "--query-gpu=timestamp,utilization.gpu,memory.used,power.draw",
                ],
                stdout=log,
            )
    results: dict[str, Any] = {"device": args.device, "cases": {}}
    started = time.perf_counter()
    spec = ServerSpec.local(
        [*command, "--tiny"] if args.tiny else command,
        port,
        log_path=out / "server.log",
        startup_timeout_s=600,
    )
    async with spec.process() as server:
        results["server_start_s"] = time.perf_counter() - started
        print(server.log_tail(2), flush=True)
        for name, max_batch in CASES:
            await server_call(f"{root}/config", {"max_batch": max_batch})
            print(f"== {name}: the server batches at most {max_batch} requests", flush=True)
            result = await asyncio.to_thread(run_diagnose, f"{root}/v1", out)
            metrics = await server_call(f"{root}/metrics")
            results["cases"][name] = {
                "max_batch": max_batch,
                "diagnose": result,
                "server_metrics": metrics,
            }
    readings: list[Reading] = []
    if smi is not None:
        smi.terminate()
        smi.wait()
        readings = smi_readings(smi_log.read_text())
    return report(results, readings, out)


def report(results: dict[str, Any], smi: list[Reading], out: Path) -> int:
    """Print the figures; PASS when each verdict is as expected and, on a GPU, the
    GPU-bound case cites GPU utilisation over its threshold."""
    from autotune.results import Evidence

    ok = True
    for name, case in results["cases"].items():
        result = case["diagnose"]
        verdict = result["verdict"]  # diagnose.json nests the verdict (schema version 2)
        print(
            f"\n== {name} (max batch {case['max_batch']}): verdict {verdict['verdict']}, "
            f"speedup ×{verdict['speedup']:.2f}"
        )
        case["probes"] = [probe_summary(p, smi) for p in result["probes"]]
        for s in case["probes"]:
            print(
                f"  parallelism {s['parallelism']:>3}: {s['rollouts_per_s']:.2f} rollouts/s, "
                f"{s['output_tokens_per_s']:.0f} tok/s; NVML ({s['nvml_samples']} samples): "
                f"util {fmt(s['util_pct'], '%')}, memory {fmt(s['memory_gib'], 'GiB')}, "
                f"power {fmt(s['power_w'], 'W')}"
            )
            if s["nvidia_smi"]:
                m = s["nvidia_smi"]
                print(
                    f"      nvidia-smi, same window ({s['nvidia_smi_samples']} samples): "
                    f"util {m['util_pct']:.1f} %, memory {m['memory_gib']:.1f} GiB, "
                    f"power {m['power_w']:.0f} W"
                )
            for source, reason in s["telemetry_unavailable"].items():
                print(f"      {source}: {reason}")
        reserved = [
            line.split()[-1]
            for line in case["server_metrics"].splitlines()
            if line.startswith("gpu_check:torch_reserved_bytes")
        ]
        if reserved:
            print(
                f"  PyTorch's peak reserved memory in the server: "
                f"{float(reserved[0]) / 2**30:.1f} GiB"
            )
        case["gpu_evidence"] = [e for e in verdict["evidence"] if e["name"].startswith("GPU")]
        cited = "; ".join(Evidence.from_dict(e).text() for e in case["gpu_evidence"]) or "none"
        print(f"  GPU evidence cited: {cited}")
        expected = "model-bound" if case["max_batch"] == CASES[0][1] else "parallelism-bound"
        case["verdict_as_expected"] = verdict["verdict"] == expected
        ok &= case["verdict_as_expected"]
    ok &= any(e["met"] for e in results["cases"][CASES[0][0]]["gpu_evidence"])
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2))
    # Without a GPU this is a dry run of the flow: a CPU is not a GPU-bound server.
    outcome = ("PASS" if ok else "FAIL") if results["device"] == "cuda" else "dry run"
    print(
        f"\nserver start {results['server_start_s']:.1f} s; {outcome}; "
        f"details in {out / 'gpu_check.json'}"
    )
    return 1 if outcome == "FAIL" else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=("check", "serve"), default="check")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (a CPU dry run)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--out", default=os.environ.get("OUT") or "reports/gpu_check")
    args = parser.parse_args()
    if args.mode == "serve":
        asyncio.run(serve(args))
        return 0
    return asyncio.run(check(args))


if __name__ == "__main__":
    sys.exit(main())
