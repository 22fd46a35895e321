"""The replay target: the simulator answering as a measured server (`--replay-table`), from
InferenceX's real serving runs (Data from InferenceX (SemiAnalysis), Apache-2.0).

A key into the table picks one configuration or is refused in one sentence that names
what the table does hold; a concurrency the table never measured is refused at launch;
and a client at a measured concurrency sees the measured time per output token.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from autotune.collector.collect_job import collect
from autotune.config.collection import CollectConfig, SyntheticWorkload, TargetConfig
from autotune.hardware.deployment import SimConfig, SimConfigError
from autotune.hardware.measured import (
    REPLAY_FLAGS,
    SurfaceError,
    load_block,
    load_surface,
    parse_key,
)
from autotune.probe.virtual import VirtualSimLauncher
from autotune.window import ProbeSettings
from tests.helpers import SimProcess, read_rows

H100_TP2 = "hw=h100,isl=1024,osl=1024,image=v0.13.0"


def test_a_key_picks_one_configuration_and_pools_its_repeats(table: Path) -> None:
    surface = load_surface(table, parse_key(H100_TP2), tp=2)
    assert surface.key["model"] == "openai/gpt-oss-120b" and surface.key["tp"] == "2"
    assert surface.concurrency == (4, 8, 16, 32, 64)
    assert surface.repeats == 10  # two runs of each point
    # Two runs at 64 measured 15.33 and 15.26 ms a token: their median.
    assert surface.tpot_s[-1] == pytest.approx((0.01533 + 0.01526) / 2, rel=0.01)
    mid = surface.tpot_at(12)  # halfway between 8 and 16
    assert mid == pytest.approx((surface.tpot_s[1] + surface.tpot_s[2]) / 2)
    assert surface.tpot_at(2) == surface.tpot_s[0]  # held below the lowest, as said at launch


def test_a_workload_of_the_tables_lengths_gets_the_measured_tpot_back(table: Path) -> None:
    """n requests of osl tokens start n·isl/osl prompt tokens of prefill a step on average:
    with those added back, a step costs the measured TPOT."""
    surface = load_surface(table, parse_key(H100_TP2), tp=2)
    for n, tpot in zip(surface.concurrency, surface.tpot_s, strict=True):
        average_prefill = round(n * surface.input_tokens / surface.output_tokens)
        assert surface.step_s(n, average_prefill) == pytest.approx(tpot, rel=0.01)


@pytest.mark.parametrize(
    ("where", "tp", "says"),
    [
        ("hw=h100,isl=1024,osl=1024", 2, "add image to --replay-where (one of: image="),
        ("hw=a100,isl=1024,osl=1024", 2, "with the rest of the key it has hw h100, h200"),
        (H100_TP2, 1, "with the rest of the key it has tp 2, 4, 8"),
        ("gpu=h100", 2, "--replay-where takes COLUMN=VALUE pairs of hw, model"),
    ],
    ids=["ambiguous", "no-such-hardware", "no-such-tp", "unknown-column"],
)
def test_a_key_that_picks_no_single_configuration_is_one_sentence(
    table: Path, where: str, tp: int, says: str
) -> None:
    with pytest.raises((SurfaceError, SimConfigError)) as caught:
        SimConfig.from_args(
            ["--replay-table", str(table), "--replay-where", where,
             "--tensor-parallel-size", str(tp), "--max-num-seqs", "64"]
        )  # fmt: skip
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_concurrency_the_table_never_measured_is_refused_at_launch(table: Path) -> None:
    args = ["--replay-table", str(table), "--replay-where", H100_TP2, "--tensor-parallel-size", "2"]
    with pytest.raises(SimConfigError, match="pass --max-num-seqs 64 or less"):
        SimConfig.from_args([*args, "--max-num-seqs", "128"])
    assert SimConfig.from_args([*args, "--max-num-seqs", "64"]).measured is not None


@pytest.mark.slow
@pytest.mark.parametrize("concurrency", [4, 16])
async def test_a_client_at_a_measured_concurrency_sees_the_measured_time_per_token(
    table: Path, sim_process: SimProcess, tmp_path: Path, concurrency: int
) -> None:
    """Requests of the table's lengths (1,024 in, 1,024 out) at 10× real time: the median
    time per output token, scaled back, within 10% of InferenceX's."""
    scale = 0.1
    flags = (
        "--replay-table", str(table), "--replay-where", H100_TP2, "--tensor-parallel-size", "2",
        "--max-num-seqs", "64", "--time-scale", str(scale),
    )  # fmt: skip
    async with sim_process(*flags) as sim:
        await collect(
            CollectConfig(
                target=TargetConfig(base_url=sim.base_url, extra_body={"ignore_eos": True}),
                synthetic=SyntheticWorkload(
                    num_tasks=3 * concurrency,
                    prompt_tokens_mean=1024,
                    prompt_tokens_std=0,
                    output_tokens_mean=1024,
                    output_tokens_std=0,
                ),
                parallelism=concurrency,
                output=tmp_path / "rollouts.jsonl",
                progress=False,
            )
        )
    rows = read_rows(tmp_path / "rollouts.jsonl")
    assert {row["response"]["usage"]["output_tokens"] for row in rows} == {1024}
    per_token = [
        (row["_autotune"]["timings"]["model_end"] - row["_autotune"]["timings"]["first_token"])
        / 1023
        / scale
        for row in rows
    ]
    measured = load_surface(table, parse_key(H100_TP2), tp=2).tpot_at(concurrency)
    replayed = statistics.median(per_token)
    print(f"concurrency {concurrency}: {replayed:.5f} s a token, InferenceX {measured:.5f}")
    assert replayed == pytest.approx(measured, rel=0.10)


# One block per engine of the table: vLLM, SGLang and ATOM on one node; TensorRT-LLM's runs
# are all disaggregated (Dynamo), so its block is one deployment, 1 prefill GPU and a TP 4
# decode worker, offered at its decode TP with its per-GPU figures over all 5 GPUs.
WHOLE_BLOCKS = {
    "vllm": "hw=h100,isl=1024,osl=1024,image=v0.13.0",
    "sglang": "hw=h200,model=deepseek-ai/DeepSeek-R1-0528,framework=sglang,isl=1024,osl=1024",
    "atom": "hw=mi355x,model=amd/DeepSeek-R1-0528-MXFP4-Preview,framework=atom,isl=1024,osl=1024",
    "trtllm": "hw=gb200,model=gpt-oss-120b,framework=dynamo-trt,image=0.7.0.post2,isl=1024,"
    "osl=1024,decode_tp=4,decode_ep=1",
}


def test_a_disaggregated_deployment_is_one_configuration_over_all_its_gpus(table: Path) -> None:
    """TensorRT-LLM's block: offered at its decode TP, its output tokens/s per GPU over its
    1 prefill and 4 decode GPUs (InferenceX's column is over the decode GPUs alone)."""
    block = load_block(table, parse_key(WHOLE_BLOCKS["trtllm"]), REPLAY_FLAGS)
    assert list(block.points) == [4] and block.gpus(4) == 5
    two_runs = (6157.9 + 6197.2) / 2  # tokens/s a decode GPU at 128, as the table has it
    assert block.points[4][128].output_tokens_per_s_per_gpu == pytest.approx(
        two_runs * 4 / 5, rel=1e-3
    )
    open_deployment = WHOLE_BLOCKS["trtllm"].removesuffix(",decode_tp=4,decode_ep=1")
    with pytest.raises(SurfaceError, match="add decode_tp, decode_num_workers, num_decode_gpu"):
        load_block(table, parse_key(open_deployment), REPLAY_FLAGS)
    surface = load_surface(table, parse_key(WHOLE_BLOCKS["trtllm"]), tp=4)
    alone = surface.step_s(0, surface.input_tokens)  # nothing decoding: the whole wait
    assert surface.disaggregated and alone == pytest.approx(surface.ttft_s[0] - surface.tpot_s[0])
    assert surface.step_s(64, 0) == pytest.approx(surface.tpot_at(64))  # no prefills held


@pytest.mark.slow
@pytest.mark.parametrize("engine", list(WHOLE_BLOCKS))
async def test_the_replay_gives_every_measured_point_of_a_block_back(
    table: Path, engine: str
) -> None:
    """At every TP and concurrency the block measured, the replay (its engine in virtual
    time, lengths spread ±10% as a benchmark's random lengths keep requests out of step)
    makes the measured output tokens/s a GPU (of the deployment: MeasuredBlock.gpus) and
    median time per output token, within 5%."""
    where = WHOLE_BLOCKS[engine]
    block = load_block(table, parse_key(where), REPLAY_FLAGS)
    isl, osl = block.input_tokens, block.output_tokens
    settings = ProbeSettings(1, min_s=60.0, max_s=3000.0, target_halfwidth=0.01)
    checked = []
    for tp, points in block.points.items():
        args = [
            "--replay-table", str(table), "--replay-where", where, "--model", "llama-3.2-1b",
            "--max-model-len", str(2 * (isl + osl)), "--max-num-seqs", str(max(points)),
        ]  # fmt: skip
        launcher = VirtualSimLauncher(args, settings, (isl, isl // 10), (osl, osl // 10))
        async with launcher.running({"tensor_parallel_size": tp}) as probe:
            for concurrency, point in points.items():
                result = await probe.measure(concurrency)
                total, ttft = result.latency_s["total"].p50, result.latency_s["ttft"].p50
                assert total is not None and ttft is not None
                tokens = result.output_tokens_per_s / block.gpus(tp)
                tpot = (total - ttft) / (osl - 1)
                measured = point.output_tokens_per_s_per_gpu, point.median_tpot_s
                checked.append((tp, concurrency, tokens / measured[0], tpot / measured[1]))
    for tp, concurrency, tokens, tpot in checked:
        print(f"{engine} TP {tp} at {concurrency}: tokens/s ×{tokens:.3f}, TPOT ×{tpot:.3f}")
    assert all(abs(tokens - 1) <= 0.05 and abs(tpot - 1) <= 0.05 for *_, tokens, tpot in checked)
    assert len(checked) == sum(len(points) for points in block.points.values()) >= 5
