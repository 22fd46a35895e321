"""The recommendation: the best configuration at 80% of its peak parallelism, with
snippets ready to paste into NeMo Gym, `vllm serve` and OpenRLHF. Pure; no I/O."""

from __future__ import annotations

from typing import Any

from autotune.study import knob_flags

# OpenRLHF's dotted flags for the vLLM knobs it exposes.
OPENRLHF_FLAGS = {
    "tensor_parallel_size": "--vllm.tensor_parallel_size",
    "gpu_memory_utilization": "--vllm.gpu_memory_utilization",
}


def recommendation(
    best: dict[str, Any], *, model: str | None, metric: str, simulated: bool
) -> dict[str, Any]:
    """`best` is a trial as saved in sweep.json (knobs, curve, value)."""
    curve = best["curve"]
    knobs = best["knobs"]
    parallelism = int(curve["recommended_parallelism"])
    vllm = " ".join(["vllm serve", model or "MODEL", *knob_flags(knobs)])
    openrlhf = [f"{flag} {knobs[name]}" for name, flag in OPENRLHF_FLAGS.items() if name in knobs]
    return {
        "simulated": simulated,
        "metric": metric,
        "server": knobs,
        "peak": {
            "parallelism": curve["peak_parallelism"],
            "throughput": curve["peak_throughput"],
            "inside_searched_range": curve["peak_inside_range"],
            "best_measured_parallelism": curve["best_measured_parallelism"],
            "best_measured_throughput": curve["best_measured_throughput"],
        },
        "recommended": {
            "parallelism": parallelism,
            "predicted_throughput": curve["recommended_throughput"],
            "rule": "80% of the peak parallelism (the NeMo Gym guide's headroom for stability)",
        },
        "knee_parallelism": curve["knee_parallelism"],
        "smallest_parallelism_at_80pct_of_peak_throughput": curve["smallest_parallelism_at_80pct"],
        "note": curve["note"],
        "snippets": {
            "nemo_gym": f"+num_samples_in_parallel={parallelism}",
            "vllm": vllm,
            "openrlhf": " ".join(openrlhf),
            "openrlhf_note": (
                f"keep rollout.batch_size × rollout.n_samples_per_prompt ÷ vllm.num_engines "
                f"near {parallelism} requests in flight per engine"
            ),
            "autotune": f"autotune collect --parallelism {parallelism}",
        },
    }
