"""Build a tiny random-weight Llama that real vLLM can serve, with no model hub.

Runs inside the vLLM virtualenv (it needs torch, transformers and tokenizers):

    python scripts/build_tiny_model.py OUT_DIR

A byte-level BPE tokenizer is trained offline on this Python's own standard-library
sources (deterministic for a given Python), a chat template is saved with it, and a
LlamaForCausalLM of about 4M parameters gets seeded random weights. The answers are
gibberish; the server's batching, scheduling, streaming and /metrics are real, which
is what throughput tests need.
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


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    return LlamaForCausalLM(config).to(torch.bfloat16)


def main(out: Path) -> None:
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"build_tiny_model: {params / 1e6:.1f}M parameters, vocab {len(tokenizer)} → {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build_tiny_model.py OUT_DIR")
    main(Path(sys.argv[1]))
