"""Build a tiny random-weight Llama that real vLLM can serve, with no model hub.

Runs inside the vLLM virtualenv (it needs torch, transformers and tokenizers):

    python scripts/build_tiny_model.py OUT_DIR [--wide]

A byte-level BPE tokenizer is trained offline on this Python's own standard-library
sources (deterministic for a given Python), a chat template is saved with it, and a
LlamaForCausalLM gets seeded random weights. The answers are gibberish; the server's
batching, scheduling, streaming and /metrics are real, which is what throughput tests
need.

The default model has about 4M bfloat16 parameters: quick to load and to step, but on a
CPU vLLM's own work per sequence is a large part of its step (measured on two cores: about
9 ms a step plus 2.2 ms a sequence), so batching pays little. `--wide` builds about 21M
float32 parameters instead, whose step is mostly reading the weights: as on a GPU, a
larger batch costs little more, so throughput grows with the sequences in flight, which
is what tests of a parallelism-bound verdict need. (float32, since AVX2 CPUs have no
bfloat16 arithmetic and emulating it makes every step compute-bound.)
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 4096
MAX_POSITIONS = 4096
CORPUS_BYTES = 8 << 20
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]

# Roles each on their own tagged line; tool definitions are listed in the system turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\nTools:\n{% for tool in tools %}{{ tool | tojson }}\n"
    "{% endfor %}{% endif %}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}"
    "{{ part['text'] }}{% endfor %}{% endif %}"
    "{% if message['tool_calls'] %}{{ message['tool_calls'] | tojson }}{% endif %}"
    "{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus() -> Iterator[str]:
    """The standard library's .py files, sorted, up to CORPUS_BYTES of text."""
    total = 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        yield text
        total += len(text)
        if total >= CORPUS_BYTES:
            return


def build_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer: PreTrainedTokenizerFast, wide: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    hidden, intermediate = (512, 2048) if wide else (256, 512)
    dtype = torch.float32 if wide else torch.bfloat16
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=4,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype=str(dtype).removeprefix("torch."),
    )
    return LlamaForCausalLM(config).to(dtype)


def main(out: Path, wide: bool) -> None:
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, wide)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"build_tiny_model: {params / 1e6:.1f}M parameters, vocab {len(tokenizer)} → {out}")


if __name__ == "__main__":
    args = sys.argv[1:]
    wide = "--wide" in args
    if len(args) != 1 + wide or args[0] == "--wide":
        sys.exit("usage: build_tiny_model.py OUT_DIR [--wide]")
    main(Path(args[0]), wide)
