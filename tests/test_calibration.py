"""`autotune sim calibrate`: the step model fitted to measured runs, and `sim serve
--profile` stepping with the fit. The shared table is InferenceX's real serving runs (Data
from InferenceX (SemiAnalysis), Apache-2.0)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.engine_model.perf_model import step_time_s
from autotune.engine_model.step_fit import Engine, RunPoint, fit, steady_state
from autotune.hardware.calibrated import load_profile
from autotune.hardware.deployment import SimConfig, SimConfigError
from autotune.hardware.memory import weights_bytes_per_gpu
from autotune.hardware.profiles import GPUS, MODELS, GiB, StepCoefficients
from autotune.sweep.calibration import table_hardware
from tests.helpers import autotune, one_sentence_error

H100 = "hw=h100,model=gpt-oss-120b,image=v0.13.0,isl=1024,osl=1024"


def test_a_mixture_of_experts_reads_the_experts_its_tokens_are_routed_to() -> None:
    oss = MODELS["gpt-oss-120b"]
    # MXFP4 experts and bf16 rest: the 60.8 GiB checkpoint, within 1%.
    assert oss.weight_bytes / GiB == pytest.approx(60.8, rel=0.01)
    assert oss.active_params / 1e9 == pytest.approx(5.1, rel=0.03)  # "5.1B active"
    one, few, many = (oss.weight_bytes_read(n) for n in (1, 8, 4096))
    assert one < few < many <= oss.weight_bytes
    # Every expert touched; the embedding table is looked up, not read whole.
    assert many == pytest.approx(oss.weight_bytes - oss.embedding_params * 2, rel=1e-6)
    assert one / GiB < 10  # one token reads 4 of 128 experts and the dense part
    dense = MODELS["llama-3.1-8b"]
    assert dense.weight_bytes_read(1) == dense.weight_bytes == weights_bytes_per_gpu(dense, 1)


def test_a_fit_recovers_the_coefficients_its_points_were_made_with() -> None:
    engine = Engine(GPUS["h100-80gb"], MODELS["llama-3.1-8b"], 8192)
    truth = StepCoefficients(
        memory_efficiency=0.55,
        compute_efficiency=0.35,
        step_overhead_s=0.002,
        allreduce_latency_s=2e-5,
    )
    points = []
    for tp in (1, 2, 4):
        for concurrency in (4, 16, 64, 256):
            for isl, osl in ((1024, 1024), (8192, 1024)):
                tpot, throughput = steady_state(engine, truth, tp, concurrency, isl, osl)
                points.append(RunPoint(tp, concurrency, isl, osl, tpot, throughput))
    fitted = fit(engine, points)
    for name in ("memory_efficiency", "compute_efficiency", "step_overhead_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.02), name


def test_calibrating_a_measured_block_meets_the_error_targets_on_the_engine(
    table: Path, tmp_path: Path
) -> None:
    result = autotune(
        "sim", "calibrate", str(table), "--where", H100, "--output-dir", str(tmp_path)
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    path = tmp_path / "profile.json"
    profile = load_profile(path)
    assert (profile.gpu.name, profile.model.name) == ("h100-80gb", "gpt-oss-120b")
    assert {(p.tp, p.concurrency) for p in profile.points} == {
        (tp, c) for tp in (2, 4, 8) for c in (4, 8, 16, 32, 64)
    }
    summary = profile.summary()
    # The targets, measured on the simulated engine with the profile.
    assert summary.throughput_median <= 0.10 and summary.throughput_worst <= 0.25, summary
    assert summary.tpot_median <= 0.10 and summary.tpot_worst <= 0.25, summary
    # The text: a row a point, the summary, and how to serve it.
    lines = result.stdout.splitlines()
    rows = [line for line in lines if line.split()[:1] and line.split()[0].isdigit()]
    assert len(rows) == len(profile.points)
    assert f"throughput error median {summary.throughput_median:.1%}" in lines[-2]
    assert lines[-1].endswith(f"`autotune sim serve --profile {path}`")
    # -q: the summary and where the profile went, not each point's error.
    quiet = autotune(
        "sim", "calibrate", "-q", str(table), "--where", H100, "--output-dir", str(tmp_path)
    )  # fmt: skip
    assert quiet.returncode == 0 and quiet.stdout.splitlines() == lines[-2:], quiet.stderr
    # A sim serve with the profile steps with its coefficients, on its GPU and model.
    config = SimConfig.from_args(["--profile", str(path)])
    assert config.coefficients == profile.coefficients
    assert (config.gpu, config.model) == (profile.gpu, profile.model)
    default = step_time_s(config.gpu, config.model, 2, 32, 0, 32 * 1500)
    calibrated = step_time_s(config.gpu, config.model, 2, 32, 0, 32 * 1500, config.coefficients)
    assert calibrated != pytest.approx(default, rel=0.05)  # the fit changed the model


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("hw=h100,model=gpt-oss-120b,isl=1024,osl=1024", "add image to --where"),
        ("hw=b200,model=gpt-oss-120b", "has no run of"),
        ("gpu=h100", "--where takes COLUMN=VALUE pairs"),
    ],
)
def test_a_key_that_picks_no_one_configuration_is_one_sentence(
    table: Path, tmp_path: Path, where: str, says: str
) -> None:
    result = autotune(
        "sim", "calibrate", str(table), "--where", where, "--output-dir", str(tmp_path)
    )
    assert result.returncode == 2
    assert says in one_sentence_error(result)
    assert not (tmp_path / "profile.json").exists()


def test_a_step_budget_below_1_is_one_sentence(table: Path, tmp_path: Path) -> None:
    result = autotune(
        "sim", "calibrate", str(table), "--where", H100, "--max-num-batched-tokens", "0",
        "--output-dir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 2
    assert "--max-num-batched-tokens must be at least 1" in one_sentence_error(result)
    assert not (tmp_path / "profile.json").exists()


def test_a_profile_for_other_hardware_or_no_profile_is_refused_at_launch(tmp_path: Path) -> None:
    missing = tmp_path / "none.json"
    with pytest.raises(SimConfigError, match="cannot read --profile"):
        SimConfig.from_args(["--profile", str(missing)])
    not_one = tmp_path / "other.json"
    not_one.write_text('{"gpu": "h100-80gb"}')
    with pytest.raises(SimConfigError, match="make one with `autotune sim calibrate`"):
        SimConfig.from_args(["--profile", str(not_one)])
    made = tmp_path / "made.json"
    made.write_text(
        json.dumps(
            {
                "format": "autotune-sim-profile/1",
                "gpu": "h200",
                "model": "llama-3.1-8b",
                "coefficients": {"memory_efficiency": 0.7},
                "calibrated_on": {"table": "t.csv", "key": {}},
            }
        )
    )
    assert SimConfig.from_args(["--profile", str(made)]).gpu.name == "h200"
    with pytest.raises(SimConfigError, match=re.escape("for llama-3.1-8b on h200, not")):
        SimConfig.from_args(["--profile", str(made), "--gpu", "h100-80gb"])


@pytest.mark.parametrize(
    ("hw", "profile", "bf16_tflops", "fp8_tflops", "memory_gb", "tb_per_s"),
    [
        ("B200", "b200", 2250, 4500, 180, 8.0),
        ("GB200", "gb200", 2500, 5000, 186, 8.0),
        ("MI300X", "mi300x", 1307.4, 2614.9, 192, 5.3),
        ("MI355X", "mi355x", 2516.6, 5033.2, 288, 8.0),
    ],
)
def test_the_gpus_users_have_are_profiles_a_table_names(
    hw: str,
    profile: str,
    bf16_tflops: float,
    fp8_tflops: float,
    memory_gb: int,
    tb_per_s: float,
) -> None:
    """A table's `hw` finds its profile (the calibration's lookup), with the datasheet's
    dense figures; a one-byte model computes at the fp8 peak, a two-byte one at bf16's."""
    block = type("Block", (), {"key": {"hw": hw, "model": "meta-llama/Llama-3.1-8B-Instruct"}})
    gpu, _ = table_hardware(block, None)  # type: ignore[arg-type]  # only its key is read
    assert gpu is GPUS[profile]
    assert gpu.bf16_flops == pytest.approx(bf16_tflops * 1e12)
    assert gpu.dense_flops(1) == pytest.approx(fp8_tflops * 1e12)
    assert gpu.dense_flops(2) == gpu.bf16_flops
    assert gpu.memory_bytes == memory_gb * 10**9 and gpu.hbm_bytes_per_s == tb_per_s * 1e12
