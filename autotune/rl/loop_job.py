"""`autotune loop`: the RL loop on the configured target and workload, its rows, its
ledger of groups and its page saved (the runner is trainer.py)."""

from __future__ import annotations

import contextlib
import logging

from autotune.config.collection import CollectConfig
from autotune.config.rl_specs import LoopSpec
from autotune.processes.event_loop import run_async
from autotune.results.runs import LoopSummary
from autotune.rl.trainer import LEDGER_FILE, GroupLedger, LoopRunner, ServerControl
from autotune.rollout.engine import Engine
from autotune.rollout.pipeline import open_pipeline
from autotune.rollout.store import RolloutSink, run_record, save_run
from autotune.rollout.workload import Workload

log = logging.getLogger("autotune")


async def loop(config: CollectConfig, spec: LoopSpec) -> LoopSummary:
    """The RL loop on the configured target and workload to its last step; rows go to
    `config.output` (with its failures file and groups.jsonl beside it) when given."""
    workload = Workload(
        config.input, config.synthetic, config.limit, config.num_repeats, config.shard
    )
    workload.validate()
    tasks = workload.probe_tasks()
    sink = RolloutSink(config.output, resume=False)
    ledger = GroupLedger(config.output.parent / LEDGER_FILE if config.output else None)
    try:
        async with open_pipeline(config) as pipeline:
            target = pipeline.target
            if config.output is not None:
                save_run(config.output, {**run_record(config), "model": target.model})
            engine = Engine(
                pipeline.backend,
                pipeline.verifier,
                sink,
                parallelism=1,  # unused: the runner launches the samples
                extra_row_fields={"simulated": True} if target.simulated else None,
            )
            control = ServerControl(pipeline.session, target.base_url)
            say = log.info if config.progress else None
            runner = LoopRunner(
                engine, control, spec, config.num_repeats, config.parallelism, ledger, say=say
            )
            identity = {
                "model": target.model,
                "base_url": target.base_url,
                "simulated": target.simulated,
                "output": str(config.output) if config.output else None,
            }
            async with contextlib.AsyncExitStack() as stack:
                live = config.live
                if live.metrics_port is not None:
                    from autotune.live.metrics import FiguresCollector, serve_metrics

                    served = serve_metrics(
                        FiguresCollector(runner.figures), live.metrics_host, live.metrics_port
                    )
                    await stack.enter_async_context(served)
                return await runner.run(tasks, identity)
    finally:
        ledger.close()
        sink.close()


def run_loop(config: CollectConfig, spec: LoopSpec) -> LoopSummary:
    """Synchronous entry point (the CLI, benchmarks, tests)."""
    return run_async(loop(config, spec))
