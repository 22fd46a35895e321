"""Hardware and model figures the simulator's performance model, the roofline and the
sweep's fit checks run on (the simulator's --gpu/--model, a study's resources).
Where the figures come from: docs/design/hardware.md.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """One accelerator: memory, bandwidths and peak dense bf16 (and fp8) compute."""

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    bf16_flops: float  # dense (no sparsity)
    interconnect_bytes_per_s: float  # GPU-to-GPU, both directions together, as datasheets quote
    source: str
    fp8_flops: float | None = None  # dense; None: no fp8 tensor cores

    def dense_flops(self, bytes_per_param: float) -> float:
        """The matrix units' peak for weights of this width: fp8's for one-byte weights
        where the GPU has it, else bf16's."""
        if bytes_per_param <= 1 and self.fp8_flops is not None:
            return self.fp8_flops
        return self.bf16_flops


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """One decoder-only transformer: dense, or with routed experts (mixture of experts).

    A step of a mixture of experts reads the dense weights and only the experts its
    tokens are routed to: each token picks `experts_per_token` of `experts`, so a step of
    n tokens touches a share 1 − (1 − k/E)^n of them (routing taken as uniform).
    """

    name: str
    params: int
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    max_position_embeddings: int
    bytes_per_param: int  # of the dense weights, activations and the KV cache
    source: str
    experts: int = 0  # routed experts per MoE layer; 0: a dense model
    experts_per_token: int = 0
    expert_params: int = 0  # parameters in the routed experts, all of them
    expert_bytes_per_param: float = 0.0  # as stored (MXFP4: 4.25 bits); 0: bytes_per_param
    full_attention_layers: int = 0  # layers whose KV spans the context; 0: all of them
    # The input embedding table: a step looks up a row a token, it neither reads the
    # table whole nor multiplies by it (0: counted with the weights a step reads).
    embedding_params: int = 0

    @property
    def expert_bytes(self) -> float:
        """The routed experts' weights as stored (0 for a dense model)."""
        return self.expert_params * (self.expert_bytes_per_param or self.bytes_per_param)

    @property
    def weight_bytes(self) -> float:
        """Every weight as stored."""
        return (self.params - self.expert_params) * self.bytes_per_param + self.expert_bytes

    @property
    def active_params(self) -> float:
        """Parameters one token runs through (all of a dense model's)."""
        dense = self.params - self.expert_params - self.embedding_params
        if not self.experts:
            return float(dense)
        return dense + self.expert_params * self.experts_per_token / self.experts

    def weight_bytes_read(self, tokens: int) -> float:
        """Weight bytes a forward pass of `tokens` tokens reads: the dense part, and the
        share of the experts its tokens are routed to."""
        read = self.weight_bytes - self.embedding_params * self.bytes_per_param
        if not self.experts:
            return read
        touched = 1 - (1 - self.experts_per_token / self.experts) ** max(tokens, 1)
        return read - self.expert_bytes * (1 - touched)

    @property
    def kv_layers(self) -> int:
        """Layers whose KV cache grows with the context (sliding-window layers keep a
        window's worth only)."""
        return self.full_attention_layers or self.layers


@dataclass(frozen=True, slots=True)
class StepCoefficients:
    """What the simulator's step model (engine_model/perf_model.py) takes from a real
    engine rather than a datasheet: the shares of peak bandwidth and compute its kernels
    sustain and its fixed costs. The defaults are rules of thumb for vLLM on NVIDIA GPUs;
    `autotune sim calibrate` fits them to measured runs (hardware/calibrated.py)."""

    memory_efficiency: float = 0.80  # of HBM bandwidth a decode step sustains
    compute_efficiency: float = 0.60  # of dense bf16 FLOP/s large prefill GEMMs sustain
    step_overhead_s: float = 0.0005  # scheduling, input preparation, sampling, launches
    allreduce_latency_s: float = 8e-6  # one small tensor-parallel all-reduce
    link_efficiency: float = 0.70  # of one direction of the GPU link an all-reduce gets


GPUS: dict[str, GpuProfile] = {
    "h100-80gb": GpuProfile(
        name="h100-80gb",  # H100 SXM5
        memory_bytes=80 * GiB,
        hbm_bytes_per_s=3.35e12,
        bf16_flops=989.4e12,  # datasheet: 1,979 TFLOPS with sparsity
        fp8_flops=1978.9e12,  # datasheet: 3,958 TFLOPS with sparsity
        interconnect_bytes_per_s=900e9,  # NVLink 4
        source="NVIDIA H100 Tensor Core GPU datasheet, SXM column "
        "(https://www.nvidia.com/en-us/data-center/h100/)",
    ),
    "h200": GpuProfile(
        name="h200",  # H200 SXM
        memory_bytes=141 * GiB,
        hbm_bytes_per_s=4.8e12,
        bf16_flops=989.4e12,  # datasheet: 1,979 TFLOPS with sparsity
        fp8_flops=1978.9e12,  # datasheet: 3,958 TFLOPS with sparsity
        interconnect_bytes_per_s=900e9,  # NVLink 4
        source="NVIDIA H200 Tensor Core GPU datasheet, SXM column "
        "(https://www.nvidia.com/en-us/data-center/h200/)",
    ),
    "a100-80gb": GpuProfile(
        name="a100-80gb",  # A100 SXM4 80GB
        memory_bytes=80 * GiB,
        hbm_bytes_per_s=2.039e12,
        bf16_flops=312e12,  # datasheet: 624 TFLOPS with sparsity
        interconnect_bytes_per_s=600e9,  # NVLink 3
        source="NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column "
        "(https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)",
    ),
    "l40s": GpuProfile(
        name="l40s",
        memory_bytes=48 * GiB,
        hbm_bytes_per_s=864e9,  # GDDR6
        bf16_flops=362.05e12,  # datasheet: 733 TFLOPS with sparsity
        fp8_flops=733e12,  # datasheet: 1,466 TFLOPS with sparsity
        interconnect_bytes_per_s=64e9,  # no NVLink: PCIe Gen4 x16
        source="NVIDIA L40S datasheet (https://www.nvidia.com/en-us/data-center/l40s/)",
    ),
    # Blackwell: the datasheets quote an 8-GPU board (HGX B200) or a 72-GPU rack (GB200
    # NVL72) with sparsity; one GPU's dense figure is the total ÷ GPUs ÷ 2.
    "b200": GpuProfile(
        name="b200",  # HGX B200, one of its 8 GPUs
        memory_bytes=180 * 10**9,  # 1,440 GB in all
        hbm_bytes_per_s=8e12,  # 64 TB/s in all
        bf16_flops=2.25e15,  # 36 PFLOPS with sparsity in all
        fp8_flops=4.5e15,  # 72 PFLOPS with sparsity in all
        interconnect_bytes_per_s=1.8e12,  # NVLink 5
        source="NVIDIA HGX B200 and DGX B200 datasheets, 8-GPU totals "
        "(https://www.nvidia.com/en-us/data-center/hgx/)",
    ),
    "gb200": GpuProfile(
        name="gb200",  # GB200 NVL72, one of its 72 Blackwell GPUs
        memory_bytes=186 * 10**9,  # 13.4 TB in all
        hbm_bytes_per_s=8e12,  # 576 TB/s in all
        bf16_flops=2.5e15,  # 360 PFLOPS with sparsity in all
        fp8_flops=5e15,  # 720 PFLOPS with sparsity in all
        interconnect_bytes_per_s=1.8e12,  # NVLink 5 (130 TB/s in all)
        source="NVIDIA GB200 NVL72 specifications, rack totals "
        "(https://www.nvidia.com/en-us/data-center/gb200-nvl72/)",
    ),
    # AMD quotes one accelerator, dense and with sparsity; its Infinity Fabric links (7 to
    # the other GPUs of an 8-GPU platform) together.
    "mi300x": GpuProfile(
        name="mi300x",
        memory_bytes=192 * 10**9,  # HBM3
        hbm_bytes_per_s=5.3e12,
        bf16_flops=1307.4e12,
        fp8_flops=2614.9e12,
        interconnect_bytes_per_s=896e9,  # 7 Infinity Fabric links of 128 GB/s
        source="AMD Instinct MI300X accelerator data sheet "
        "(https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html)",
    ),
    "mi355x": GpuProfile(
        name="mi355x",
        memory_bytes=288 * 10**9,  # HBM3E
        hbm_bytes_per_s=8e12,
        bf16_flops=2516.6e12,
        fp8_flops=5033.2e12,  # 256 CUs × 8,192 fp8 FLOPs a clock × 2.4 GHz
        interconnect_bytes_per_s=1075.2e9,  # 7 Infinity Fabric links of 153.6 GB/s
        source="AMD Instinct MI355X accelerator data sheet "
        "(https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html)",
    ),
}

MODELS: dict[str, ModelProfile] = {
    "llama-3.2-1b": ModelProfile(
        name="llama-3.2-1b",
        params=1_235_814_400,  # tied embeddings
        layers=16,
        hidden_size=2048,
        attention_heads=32,
        kv_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        bytes_per_param=2,
        source="https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json",
    ),
    "qwen2.5-7b": ModelProfile(
        name="qwen2.5-7b",
        params=7_615_616_512,
        layers=28,
        hidden_size=3584,
        attention_heads=28,  # not divisible by 8: tensor-parallel size 8 cannot shard it
        kv_heads=4,
        head_dim=128,
        max_position_embeddings=131072,
        bytes_per_param=2,
        source="https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json",
    ),
    "llama-3.1-8b": ModelProfile(
        name="llama-3.1-8b",
        params=8_030_261_248,
        layers=32,
        hidden_size=4096,
        attention_heads=32,
        kv_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        bytes_per_param=2,
        source="https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json",
    ),
    "llama-3.1-70b": ModelProfile(
        name="llama-3.1-70b",
        params=70_553_706_496,
        layers=80,
        hidden_size=8192,
        attention_heads=64,
        kv_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        bytes_per_param=2,
        source="https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json",
    ),
    "gpt-oss-120b": ModelProfile(
        name="gpt-oss-120b",
        params=116_829_156_672,
        layers=36,
        hidden_size=2880,
        attention_heads=64,
        kv_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        bytes_per_param=2,
        source="https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json "
        "(117B parameters, 5.1B active, a 60.8 GiB checkpoint)",
        experts=128,
        experts_per_token=4,
        # 36 layers × 128 experts × (2880 × 5760 + 5760 + 2880 × 2880 + 2880)
        expert_params=114_701_598_720,
        expert_bytes_per_param=4.25 / 8,  # MXFP4: 4-bit values, an 8-bit scale per 32
        full_attention_layers=18,  # the others alternate with a 128-token sliding window
        embedding_params=201_088 * 2880,  # its vocabulary × hidden size (the output head apart)
    ),
}


def _normalise(name: str) -> str:
    """`meta-llama/Llama-3.1-8B-Instruct` -> `llama-3.1-8b`, so real vLLM model ids work too."""
    key = name.rsplit("/", 1)[-1].lower()
    for prefix in ("meta-",):
        key = key.removeprefix(prefix)
    for suffix in ("-instruct", "-hf"):
        key = key.removesuffix(suffix)
    return key


def find_model(name: str) -> ModelProfile | None:
    """The model profile for a profile name or a Hugging Face id, or None."""
    return MODELS.get(name) or MODELS.get(_normalise(name))
