"""The GPU-resident generation server benchmarks/gpu_check.py measures: a random-weight
Llama of a realistic size (or a 2-layer one, `--tiny`), batched `generate` on the device
behind a small OpenAI-compatible HTTP front with vLLM-style /metrics and a /config that
sets its batch limit. Run as a script under any Python with torch, transformers and
aiohttp (it imports nothing of autotune):

    python benchmarks/harness/gpu_server.py --port 8000 [--device cpu --tiny] [--max-batch 4]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

VOCAB = 32000
BYTES_PER_TOKEN = 4  # the stand-in tokenizer's rate, about a real one's on English
# How long a batch waits for more requests after its first: a closed loop's slots come
# back staggered by their verification and scheduling; 20 ms was seen to split static
# batches of 4 into batches of 1 for seconds at a time.
GATHER_S = 0.1
# A 23B-parameter shape (47 GB in bf16; a Llama-70B layer, 24 of them): each decode step
# reads all the weights in few, large kernels, so the GPU, not Python launching kernels,
# sets the pace, and NVML's utilisation means something.
FULL = {"hidden": 8192, "intermediate": 28672, "layers": 24, "heads": 64}
TINY = {"hidden": 64, "intermediate": 128, "layers": 2, "heads": 2}


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
            deadline = loop.time() + GATHER_S
            while len(batch) < self.max_batch:
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), deadline - loop.time()))
                except TimeoutError:
                    break
            # A request whose client left while it queued is dropped, as vLLM aborts it.
            batch = [item for item in batch if not item[2].done()]
            if not batch:
                continue
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
                if not future.done():  # its client may have left while it ran
                    future.set_result(tokens[:n])

    def metrics(self) -> str:
        lines = [
            f"vllm:num_requests_running {self.running}",
            f"vllm:num_requests_waiting {self.queue.qsize()}",
            f"vllm:prompt_tokens_total {self.prompt_tokens}",
            f"vllm:generation_tokens_total {self.generation_tokens}",
        ]
        if self.device == "cuda":  # NVML's memory used is this plus the CUDA context
            cuda = self.torch.cuda
            lines.append(f"gpu_check:torch_reserved_bytes {cuda.max_memory_reserved()}")
            lines.append(f"gpu_check:torch_reserved_now_bytes {cuda.memory_reserved()}")
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
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()
    print(f"listening on {args.port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        batcher.cancel()
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (a CPU dry run)")
    parser.add_argument("--max-batch", type=int, default=4)
    asyncio.run(serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
