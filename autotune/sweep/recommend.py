"""The recommendation: the best configuration at 80% of its peak parallelism, with
lines ready to paste into NeMo Gym, `vllm serve` and OpenRLHF. Pure: computed from a
saved SweepResult alone, never from a live study."""

from __future__ import annotations

from autotune.results import Peak, Recommendation, Recommended, Snippets, SweepResult
from autotune.servers.flags import server_flags

# OpenRLHF's dotted flags for the vLLM knobs it exposes.
OPENRLHF_FLAGS = {
    "tensor_parallel_size": "--vllm.tensor_parallel_size",
    "gpu_memory_utilization": "--vllm.gpu_memory_utilization",
}
RULE = "80% of the peak parallelism (the NeMo Gym guide's headroom for stability)"


def vllm_serve_line(model: str | None, knobs: dict[str, object]) -> str:
    """The `vllm serve` line for a configuration, its flags spelled as they were launched."""
    return " ".join(["vllm serve", model or "MODEL", *server_flags(knobs)])


def recommendation(result: SweepResult) -> Recommendation | None:
    """None when no feasible trial has a fitted curve."""
    best = result.best()
    if best is None or best.curve is None:
        return None
    curve, knobs = best.curve, best.knobs
    parallelism = int(curve.recommended_parallelism)
    openrlhf = [f"{flag} {knobs[name]}" for name, flag in OPENRLHF_FLAGS.items() if name in knobs]
    return Recommendation(
        simulated=result.simulated,
        metric=result.metric,
        server=knobs,
        peak=Peak(
            parallelism=curve.peak_parallelism,
            throughput=curve.peak_throughput,
            inside_searched_range=curve.peak_inside_range,
            best_measured_parallelism=curve.best_measured_parallelism,
            best_measured_throughput=curve.best_measured_throughput,
        ),
        recommended=Recommended(parallelism, curve.recommended_throughput, RULE),
        knee_parallelism=curve.knee_parallelism,
        smallest_parallelism_at_80pct_of_peak_throughput=curve.smallest_parallelism_at_80pct,
        note=curve.note,
        snippets=Snippets(
            nemo_gym=f"+num_samples_in_parallel={parallelism}",
            vllm=vllm_serve_line(result.model, knobs),
            openrlhf=" ".join(openrlhf),
            openrlhf_note=(
                f"keep rollout.batch_size × rollout.n_samples_per_prompt ÷ vllm.num_engines "
                f"near {parallelism} requests in flight per engine"
            ),
            autotune=f"autotune collect --parallelism {parallelism}",
        ),
    )
