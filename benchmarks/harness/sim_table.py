"""The simulator's scenarios as a ground truth: the simulated engine run at each TP and
concurrency in virtual time, written as a table in InferenceX's format (sweep_methods.py)."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

SIM_SCENARIOS = {  # those of benchmarks/sweep_efficiency.py
    "sim-70b-h100": ("h100-80gb", "llama-3.1-70b", (2, 4, 8)),
    "sim-7b-l40s": ("l40s", "qwen2.5-7b", (1, 2, 4, 8)),  # 28 heads: TP 8 cannot shard them
}
SIM_LENGTHS = (1024, 256)
SIM_CONCURRENCY = (4, 8, 16, 32, 64, 128)
TRUTH_IMAGE, OTHER_IMAGE = "autotune-sim:defaults", "autotune-sim:other-release"
# The release the prior is calibrated on (the table's other image, as for the measured
# blocks): its steps 30% dearer to start, 10% less of the bandwidth sustained.
OTHER_RELEASE = {"step_overhead_s": 1.3, "memory_efficiency": 0.9}
TABLE_COLUMNS = ["conc", "output_tput_per_gpu", "median_e2el", "p99_e2el", "median_tpot",
                 "median_ttft"]  # fmt: skip


async def sim_table(path: Path) -> Path:
    """Every simulator scenario run at each TP and concurrency on the simulated engine
    (in virtual time, as `sim serve --profile` runs it), written in the shared table's
    format: under the default step coefficients (the truth) and under another release's
    (what its prior is calibrated on). A TP the model cannot shard is left out."""
    from autotune.config.knobs import KNOBS
    from autotune.engine_model.step_fit import Engine, RunPoint
    from autotune.hardware.calibrated import CalibratedProfile
    from autotune.hardware.measured import KEY_COLUMNS, SINGLE_NODE
    from autotune.hardware.profiles import GPUS, StepCoefficients, find_model
    from autotune.sweep.calibration import run_point, tpot_s

    rows = []
    isl, osl = SIM_LENGTHS
    for name, (gpu_name, model_name, tps) in SIM_SCENARIOS.items():
        gpu, model = GPUS[gpu_name], find_model(model_name)
        assert model is not None
        engine = Engine(gpu, model, KNOBS.max_num_batched_tokens)
        for image in (TRUTH_IMAGE, OTHER_IMAGE):
            scale = OTHER_RELEASE if image == OTHER_IMAGE else {}
            base = StepCoefficients()
            coefficients = dataclasses.replace(
                base, **{field: getattr(base, field) * by for field, by in scale.items()}
            )
            profile = path.with_name(f"{name}-{image.rpartition(':')[2]}.json")
            CalibratedProfile(gpu, model, coefficients, "defaults", {}).save(profile)
            key = {"hw": gpu_name.split("-")[0], "model": model_name, "framework": "vllm",
                   "precision": "bf16", "image": image, "isl": isl, "osl": osl, "ep": 1,
                   **SINGLE_NODE}  # fmt: skip
            for tp in (tp for tp in tps if model.attention_heads % tp == 0):
                for conc in SIM_CONCURRENCY:
                    point = RunPoint(tp, conc, isl, osl, 0.0, 0.0)
                    result = await run_point(profile, coefficients, engine, point)
                    total, first = result.latency_s["total"], result.latency_s["ttft"]
                    rows.append(
                        {**key, "tp": tp, "conc": conc,
                         "output_tput_per_gpu": result.output_tokens_per_s / tp,
                         "median_e2el": total.p50, "p99_e2el": total.p99,
                         "median_tpot": tpot_s(result, osl), "median_ttft": first.p50}
                    )  # fmt: skip
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, [*KEY_COLUMNS, *SINGLE_NODE, *TABLE_COLUMNS])
        writer.writeheader()
        writer.writerows(rows)
    return path
