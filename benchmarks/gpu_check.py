"""NVML telemetry and GPU evidence in diagnose on a GPU; target: expected verdicts, GPU cited.

What only a GPU shows: NVML telemetry during probes, and GPU evidence in a verdict.
Starts a GPU-resident generation server of its own (a random-weight Llama of a
realistic size, batched `generate` on the GPU behind a small OpenAI-compatible HTTP
front with vLLM-style /metrics), then runs `autotune diagnose --base-url` against it
twice: with the server batching at most 4 requests (the high probe queues: the GPU
is the limit) and at most 64 (it batches everything: parallelism is the limit). For
each probe it prints autotune's NVML figures (utilisation, memory, power), the very
ones diagnose.json holds, over the probe's measured blocks (its warm-ups, drains and
the other probe's blocks left out), with their reading counts, beside an independent
`nvidia-smi` reading of the same blocks, then each block alone; where NVML and
nvidia-smi differ by more than 5 points it says why. Then the server's own count of
the memory PyTorch holds, the verdict and the GPU evidence it cites.

`--replicas N` starts N servers instead, the i-th alone on GPU i, and runs one
`autotune diagnose --base-url ... --replica-gpus i ...` across them, with each probe's
parallelism N times the single server's (each replica then sees the same batches and
queue). Each probe then also reports every replica's calls/s and its GPU's NVML
readings (grouped by autotune, and per GPU) beside nvidia-smi's reading of that GPU.

    python benchmarks/gpu_check.py                   # on a GPU machine (H100/H200)
    python benchmarks/gpu_check.py --replicas 2      # one server per GPU, two GPUs
    python benchmarks/gpu_check.py --device cpu --tiny [--replicas 2]  # no GPU

Needs torch and transformers (and autotune's own dependencies); nothing is downloaded.
`--server-python` serves the model from another environment's Python, one that has
torch and transformers where autotune's own has not. Writes gpu_check.json to --out
(default $OUT, else reports/gpu_check).

Targets, on a GPU: the gpu-bound case (max batch 4) is model-bound, the batching case (64)
parallelism-bound; the gpu-bound verdict cites GPU utilisation over its threshold, and
the figure it cites is the high probe's printed; in every probe NVML and nvidia-smi agree
within 5 points or within sampling error; with replicas, every replica serves calls in
every probe and has its own GPU's readings. Exit
status is 0 unless --check is given and a target is missed; without a GPU (a dry run of
the flow) the targets are shown, not judged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

# autotune from this checkout, where this Python has not installed it.
sys.path.insert(0, str(harness.REPO))

SERVER = Path(__file__).parent / "harness" / "gpu_server.py"  # run under --server-python
PROBES = ["--low", "4", "--high", "16", "--min-s", "4", "--no-stream"]
WORKLOAD = ["--synthetic", "400", "--prompt-tokens", "256,0", "--output-tokens", "64,0"]
CASES = (("gpu-bound", 4), ("batching", 64))  # (name, the server's max batch)


# -- the check ---------------------------------------------------------------------------

Reading = tuple[float, int, float, float, float]  # epoch s, GPU index, util %, GiB, W
Window = tuple[float, float]  # epoch seconds
SMI_EVERY_MS = 250  # nvidia-smi's reading interval
AGREE_POINTS = 5.0  # NVML and nvidia-smi over one window agree within this, else say why
SMI_FIELDS = ("util_pct", "memory_gib", "power_w")
NVML_SUFFIXES = {"util_pct": "util_pct", "memory_gib": "mem_used_gib", "power_w": "power_w"}


def smi_readings(text: str) -> list[Reading]:
    """nvidia-smi's CSV lines; it stamps local wall-clock time, made epoch seconds here."""
    readings = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            stamp, _, fraction = parts[0].partition(".")
            when = time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S"))
            when += float(f"0.{fraction or 0}")
            util, memory, power = float(parts[2]), float(parts[3]) / 1024, float(parts[4])
            readings.append((when, int(parts[1]), util, memory, power))
        except (ValueError, IndexError):
            continue
    return readings


def probe_windows(probe: dict[str, Any]) -> list[Window]:
    """A probe's measured blocks, epoch seconds: what its telemetry summary, and so a
    verdict's GPU figure, covers; its warm-ups, drains and the other probe's blocks in
    between are no part of it."""
    return [(block["at"], block["at"] + block["measured_s"]) for block in probe["blocks"]]


def inside(t: float, windows: list[Window]) -> bool:
    return any(start <= t <= end for start, end in windows)


def smi_window(smi: list[Reading], windows: list[Window]) -> dict[int, dict[str, Any]]:
    """nvidia-smi's means per GPU index over the windows, with their sample counts (and
    the utilisation readings themselves, for the sampling error)."""
    by_gpu: dict[int, list[Reading]] = {}
    for reading in smi:
        if inside(reading[0], windows):
            by_gpu.setdefault(reading[1], []).append(reading)
    return {
        index: {
            **{name: sum(r[i] for r in rows) / len(rows) for i, name in enumerate(SMI_FIELDS, 2)},
            "samples": len(rows),
            "util_readings": [r[2] for r in rows],
        }
        for index, rows in sorted(by_gpu.items())
    }


def smi_over_all(per_gpu: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """Every GPU together, as NVML's probe-wide keys read: utilisation the mean over the
    GPUs, memory and power their sum."""
    if not per_gpu:
        return None
    gpus = list(per_gpu.values())
    return {
        "util_pct": sum(g["util_pct"] for g in gpus) / len(gpus),
        "memory_gib": sum(g["memory_gib"] for g in gpus),
        "power_w": sum(g["power_w"] for g in gpus),
        "samples": min(g["samples"] for g in gpus),
        "util_readings": [value for g in gpus for value in g["util_readings"]],
    }


def sampling_error(values: list[float]) -> float:
    """The variance of the mean of `values` (a mean's squared standard error)."""
    if len(values) < 2:
        return math.inf
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values)


def agreement(nvml: float, nvml_readings: list[float], smi: dict[str, Any]) -> dict[str, Any]:
    """NVML's utilisation beside nvidia-smi's over the same window: the difference, the
    95% range sampling alone gives it, and where over AGREE_POINTS, the reason."""
    difference = nvml - smi["util_pct"]
    noise = 1.96 * math.sqrt(sampling_error(nvml_readings) + sampling_error(smi["util_readings"]))
    reason = None
    if abs(difference) > AGREE_POINTS:
        reason = (
            f"within sampling error (±{noise:.1f} points at 95%): the load switches on and "
            "off between readings, and nvidia-smi reads the driver's latest sample each "
            f"{SMI_EVERY_MS} ms where NVML averages every sample since its previous reading"
            if abs(difference) <= noise
            else f"more than sampling error explains (±{noise:.1f} points at 95%)"
        )
    return {
        "difference": difference,
        "sampling_error_95": noise,
        "agree": abs(difference) <= max(AGREE_POINTS, noise),
        "reason": reason,
    }


def nvml_window(series: list[dict[str, Any]], windows: list[Window]) -> dict[str, Any]:
    """autotune's NVML readings of all GPUs inside the windows: their utilisation values
    and how many of the driver's samples they average."""
    gpu = [s for s in series if s["source"] == "gpu" and inside(s["t"], windows)]
    util = [s["gpu_util_pct_mean"] for s in gpu if "gpu_util_pct_mean" in s]
    driver = sum(value for s in gpu for key, value in s.items() if key.endswith("_util_samples"))
    return {
        "util_pct": sum(util) / len(util) if util else None,
        "readings": len(util),
        "driver_samples": int(driver),
        "util_readings": util,
    }


def block_summary(
    probe: dict[str, Any], window: Window, smi: list[Reading], origin: float
) -> dict[str, Any]:
    """One measured block: NVML and nvidia-smi over exactly its seconds."""
    nvml = nvml_window(probe["series"], [window])
    smi_all = smi_over_all(smi_window(smi, [window]))
    compared = None
    if nvml["util_pct"] is not None and smi_all is not None:
        compared = agreement(nvml["util_pct"], nvml["util_readings"], smi_all)
    return {
        "from_s": window[0] - origin,
        "to_s": window[1] - origin,
        "nvml": nvml,
        "nvidia_smi": smi_all,
        "compared": compared,
    }


def replica_summary(
    replica: dict[str, Any], telemetry: dict[str, Any], smi: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """One replica's share of a probe: its calls, autotune's NVML readings of its GPUs
    (grouped by --replica-gpus, and per GPU) beside nvidia-smi's of the same GPUs."""
    per_gpu = {
        index: {
            name: telemetry.get(f"gpu/gpu{index}_{suffix}")
            for name, suffix in NVML_SUFFIXES.items()
        }
        for index in replica["gpus"]
    }
    return {
        "index": replica["index"],
        "url": replica["url"],
        "completed": replica["completed"],
        "calls_per_s": replica["calls_per_s"],
        "mean_latency_s": replica["mean_latency_s"],
        "server": replica["server"],
        "gpus": replica["gpus"],
        "nvml": replica["gpu"],
        "nvml_per_gpu": per_gpu,
        "nvidia_smi_per_gpu": {index: smi[index] for index in replica["gpus"] if index in smi},
    }


def probe_summary(probe: dict[str, Any], smi: list[Reading], origin: float) -> dict[str, Any]:
    """autotune's NVML figures of one probe, the very ones diagnose.json holds (and a
    verdict cites), beside nvidia-smi's over the same measured blocks, and block by block;
    seconds count from `origin`."""
    windows = probe_windows(probe)
    telemetry = probe["telemetry"]
    nvml = nvml_window(probe["series"], windows)
    util = telemetry.get("gpu/gpu_util_pct_mean")
    per_gpu = smi_window(smi, windows)
    smi_all = smi_over_all(per_gpu)
    compared = None
    if util is not None and smi_all is not None:
        compared = agreement(util["mean"], nvml["util_readings"], smi_all)
    return {
        "parallelism": probe["parallelism"],
        "rollouts_per_s": probe["rollouts_per_s"],
        "output_tokens_per_s": probe["output_tokens_per_s"],
        "measured_s": probe["measured_s"],
        "blocks": [block_summary(probe, window, smi, origin) for window in windows],
        "util_pct": util,
        "driver_samples": nvml["driver_samples"],
        "memory_gib": telemetry.get("gpu/gpu_mem_used_gib_total"),
        "power_w": telemetry.get("gpu/gpu_power_w_total"),
        "nvidia_smi": smi_all,
        "nvidia_smi_per_gpu": per_gpu,
        "compared": compared,
        "replicas": [replica_summary(r, telemetry, per_gpu) for r in probe.get("replicas", [])],
        "telemetry_unavailable": probe["telemetry_unavailable"],
    }


def fmt(stat: dict[str, float] | None, unit: str) -> str:
    """autotune's summary of a series: its mean, max and how many readings."""
    if stat is None:
        return "-"
    readings = f", {stat['samples']:.0f} readings" if "samples" in stat else ""
    return f"{stat['mean']:.1f} {unit} (max {stat['max']:.1f}{readings})"


def fmt_smi(means: dict[str, Any]) -> str:
    return (
        f"util {means['util_pct']:.1f} %, memory {means['memory_gib']:.1f} GiB, "
        f"power {means['power_w']:.0f} W ({means['samples']:.0f} samples)"
    )


def fmt_compared(compared: dict[str, Any] | None) -> str:
    if compared is None:
        return ""
    text = f"; NVML − nvidia-smi {compared['difference']:+.1f} points"
    return text + (f": {compared['reason']}" if compared["reason"] else "")


def probes_for(replicas: int, max_s: float) -> list[str]:
    """The probes, scaled so each replica sees what the one server sees alone: the same
    batches, the same queue; each capped at `max_s` seconds."""
    low, high = (str(int(PROBES[i]) * replicas) for i in (1, 3))
    return ["--low", low, "--high", high, *PROBES[4:], "--max-s", f"{max_s:g}"]


def run_diagnose(base_urls: list[str], out: Path, max_s: float) -> dict[str, Any]:
    """`autotune diagnose --base-url ...`, as a user runs it; the i-th replica on GPU i
    (named on a CPU dry run too, where NVML then has nothing to group). What it prints
    is kept beside its diagnose.json as it ends."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "diagnose.json"
    replicas = len(base_urls)
    urls = [word for url in base_urls for word in ("--base-url", url)]
    placement = (
        [word for i in range(replicas) for word in ("--replica-gpus", str(i))]
        if replicas > 1
        else []
    )
    synthetic = ["--synthetic", str(int(WORKLOAD[1]) * replicas), *WORKLOAD[2:]]
    command = [
        *("diagnose", *urls, *placement),
        *probes_for(replicas, max_s),
        *synthetic,
        *("--output-dir", str(out)),
    ]
    done = harness.autotune_cli(*command, timeout=600)
    (out / "stdout.txt").write_text(done.stdout + done.stderr)
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


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports (two calls of free_port may hand back the same one)."""
    from autotune.servers.launcher import free_port

    ports: list[int] = []
    while len(ports) < count:
        if (port := free_port()) not in ports:
            ports.append(port)
    return ports


async def check(args: argparse.Namespace) -> int:
    from autotune.servers.launcher import ServerSpec

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ports = free_ports(args.replicas)
    roots = [f"http://127.0.0.1:{port}" for port in ports]
    smi = None
    smi_log = out / "nvidia_smi.csv"
    if shutil.which("nvidia-smi"):  # an independent reading of the same counters, per GPU
        with smi_log.open("w") as log:
            smi = subprocess.Popen(
                [
                    *("nvidia-smi", "--format=csv,noheader,nounits", "-lms", str(SMI_EVERY_MS)),
                    "--query-gpu=timestamp,index,utilization.gpu,memory.used,power.draw",
                ],
                stdout=log,
            )
    results: dict[str, Any] = {"device": args.device, "replicas": args.replicas, "cases": {}}
    processes = []
    for i, port in enumerate(ports):
        command = [args.server_python, str(SERVER), "--port", str(port)]
        command += ["--device", args.device, *(["--tiny"] if args.tiny else [])]
        # The i-th replica alone on GPU i, numbered as NVML and nvidia-smi number them
        # (CUDA's own default order puts the fastest first).
        env = (
            {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(i)}
            if args.replicas > 1 and args.device == "cuda"
            else {}
        )
        log_path = out / ("server.log" if args.replicas == 1 else f"server{i}.log")
        spec = ServerSpec.local(command, port, env=env, log_path=log_path, startup_timeout_s=600)
        processes.append(spec.process())
    started = time.perf_counter()
    try:
        # Together: each builds its model on its own GPU.
        starts = await asyncio.gather(*(p.start() for p in processes), return_exceptions=True)
        for error in starts:
            if isinstance(error, BaseException):
                raise error
        results["server_start_s"] = time.perf_counter() - started
        for process in processes:
            print(process.log_tail(2), flush=True)
        for name, max_batch in CASES:
            if name not in args.cases:
                continue
            for root in roots:
                await server_call(f"{root}/config", {"max_batch": max_batch})
            print(
                f"== {name}: each of {args.replicas} server(s) batches at most {max_batch} "
                "requests",
                flush=True,
            )
            urls = [f"{root}/v1" for root in roots]
            result = await asyncio.to_thread(run_diagnose, urls, out / name, args.max_s)
            results["cases"][name] = {
                "max_batch": max_batch,
                "diagnose": result,
                "server_metrics": [await server_call(f"{root}/metrics") for root in roots],
            }
    finally:
        for process in processes:
            await process.stop()
    readings: list[Reading] = []
    if smi is not None:
        smi.terminate()
        smi.wait()
        readings = smi_readings(smi_log.read_text())
    return report(results, readings, out, args.check)


def server_memory(metrics: str) -> dict[str, float]:
    """What the server's PyTorch holds on its GPU, from its /metrics, in GiB."""
    found = {}
    for line in metrics.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("gpu_check:torch_"):
            found[name.removeprefix("gpu_check:torch_").removesuffix("_bytes")] = (
                float(value) / 2**30
            )
    return found


def print_replicas(probe: dict[str, Any]) -> None:
    """Each replica's calls and its GPUs: NVML through autotune beside nvidia-smi."""
    for r in probe["replicas"]:
        latency = r["mean_latency_s"]
        print(
            f"      replica {r['index']} ({r['url']}, GPUs {r['gpus'] or '-'}): "
            f"{r['completed']} calls, {r['calls_per_s']:.2f} calls/s, mean latency "
            + ("-" if latency is None else f"{latency:.2f} s")
            + f", server waiting {r['server'].get('waiting', float('nan')):.1f}"
        )
        if r["nvml"]:
            nvml = r["nvml"]
            print(
                "        NVML over its GPUs (means): "
                + ", ".join(f"{k} {v:.1f}" for k, v in nvml.items())
            )
        for index, readings in r["nvml_per_gpu"].items():
            print(
                f"        GPU {index} NVML: util {fmt(readings['util_pct'], '%')}, "
                f"memory {fmt(readings['memory_gib'], 'GiB')}, "
                f"power {fmt(readings['power_w'], 'W')}"
            )
            if index in r["nvidia_smi_per_gpu"]:
                print(f"        GPU {index} nvidia-smi: {fmt_smi(r['nvidia_smi_per_gpu'][index])}")


def report(results: dict[str, Any], smi: list[Reading], out: Path, check: bool) -> int:
    """Print the figures and the targets: each verdict as expected; on a GPU the GPU-bound
    case cites GPU utilisation over its threshold; with replicas every replica served
    calls in every probe and (on a GPU) had its own GPU's readings. Off a GPU they are
    not judged: a CPU is not a GPU-bound server."""
    from autotune.results.diagnosis import Evidence

    on_gpu = results["device"] == "cuda"
    targets = []
    for name, case in results["cases"].items():
        result = case["diagnose"]
        verdict = result["verdict"]  # diagnose.json nests the verdict (schema version 2)
        print(
            f"\n== {name} (max batch {case['max_batch']}): verdict {verdict['verdict']}, "
            f"speedup ×{verdict['speedup']:.2f}"
        )
        probes = result["probes"]
        origin = min((b["at"] for p in probes for b in p["blocks"]), default=0.0)
        case["probes"] = [probe_summary(p, smi, origin) for p in probes]
        for s in case["probes"]:
            print(
                f"  parallelism {s['parallelism']:>3}: {s['rollouts_per_s']:.2f} rollouts/s, "
                f"{s['output_tokens_per_s']:.0f} tok/s"
            )
            print(
                f"      NVML over its {len(s['blocks'])} measured blocks "
                f"({s['measured_s']:.1f} s, {s['driver_samples']} driver samples): "
                f"util {fmt(s['util_pct'], '%')}, memory {fmt(s['memory_gib'], 'GiB')}, "
                f"power {fmt(s['power_w'], 'W')}"
            )
            if s["nvidia_smi"]:
                print(
                    f"      nvidia-smi, same blocks, all GPUs: {fmt_smi(s['nvidia_smi'])}"
                    + fmt_compared(s["compared"])
                )
            for i, block in enumerate(s["blocks"], 1):
                nvml, smi_block = block["nvml"], block["nvidia_smi"]
                util = nvml["util_pct"]
                print(
                    f"      block {i}, {block['from_s']:.1f}-{block['to_s']:.1f} s: NVML "
                    + ("-" if util is None else f"{util:.1f} %")
                    + f" ({nvml['readings']} readings, {nvml['driver_samples']} driver samples)"
                    + (
                        f", nvidia-smi {smi_block['util_pct']:.1f} % "
                        f"({smi_block['samples']} samples)"
                        if smi_block
                        else ""
                    )
                    + fmt_compared(block["compared"])
                )
            for source, reason in s["telemetry_unavailable"].items():
                print(f"      {source}: {reason}")
            print_replicas(s)
        case["server_memory_gib"] = [server_memory(m) for m in case["server_metrics"]]
        for i, memory in enumerate(case["server_memory_gib"]):
            if memory:
                print(
                    f"  server {i}: PyTorch reserves {memory.get('reserved_now', 0):.1f} GiB "
                    f"on its GPU now, {memory.get('reserved', 0):.1f} GiB at its peak"
                )
        case["gpu_evidence"] = [e for e in verdict["evidence"] if e["name"].startswith("GPU")]
        cited = "; ".join(Evidence.from_dict(e).text() for e in case["gpu_evidence"]) or "none"
        print(f"  GPU evidence cited: {cited}")
        high = max(case["probes"], key=lambda s: s["parallelism"])
        if case["gpu_evidence"] and high["util_pct"] is not None:
            same = case["gpu_evidence"][0]["value"] == high["util_pct"]["mean"]
            name_same = f"{name}: the GPU figure cited is the high probe's printed above"
            targets.append(harness.Target(name_same, same, True, "=="))
        if on_gpu:
            agreed = sum(bool(s["compared"] and s["compared"]["agree"]) for s in case["probes"])
            name_agreed = (
                f"{name}: probes where NVML and nvidia-smi agree within {AGREE_POINTS:g} "
                "points or sampling error"
            )
            targets.append(harness.Target(name_agreed, agreed, len(case["probes"]), "=="))
        expected = "model-bound" if case["max_batch"] == CASES[0][1] else "parallelism-bound"
        case["verdict_as_expected"] = verdict["verdict"] == expected
        targets.append(harness.Target(f"{name}: verdict", verdict["verdict"], expected, "=="))
        if name == CASES[0][0]:
            met = any(e["met"] for e in case["gpu_evidence"])
            targets.append(harness.Target(f"{name}: GPU utilisation cited, met", met, True, "=="))
        if results["replicas"] > 1:
            probes = case["probes"]
            served = sum(
                len(s["replicas"]) == results["replicas"]
                and all(r["completed"] > 0 for r in s["replicas"])
                for s in probes
            )
            name_served = f"{name}: probes where every replica served calls"
            targets.append(harness.Target(name_served, served, len(probes), "=="))
            if on_gpu:
                read = sum(all("util_pct" in r["nvml"] for r in s["replicas"]) for s in probes)
                name_read = f"{name}: probes with every replica's GPU read"
                targets.append(harness.Target(name_read, read, len(probes), "=="))
    results["targets"] = [t.as_dict() for t in targets]
    results["passed"] = all(t.passed for t in targets)
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2))
    print(f"\nserver start {results['server_start_s']:.1f} s; details in {out / 'gpu_check.json'}")
    return harness.report_targets(targets, check, judged=on_gpu)


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__, json=False)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (a CPU dry run)")
    parser.add_argument(
        "--replicas",
        type=harness.count,
        default=1,
        help="servers, one per GPU (the i-th on GPU i), behind one diagnose (default: 1)",
    )
    parser.add_argument(
        "--server-python",
        default=sys.executable,
        help="the Python that serves the model: one with torch and transformers "
        "(default: this one)",
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--max-s",
        type=float,
        default=30.0,
        help="each probe's cap, seconds (diagnose --max-s; two blocks of half each)",
    )
    parser.add_argument(
        "--cases",
        type=lambda text: text.split(","),
        default=[name for name, _ in CASES],
        help="which cases to run, comma-separated (default: gpu-bound,batching)",
    )
    parser.add_argument("--out", default=os.environ.get("OUT") or "reports/gpu_check")
    args = parser.parse_args(argv)
    return asyncio.run(check(args))


if __name__ == "__main__":
    raise SystemExit(main())
