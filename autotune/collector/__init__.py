"""The collection run behind `autotune collect`: the rollout engine, GRPO groups or batch
steps, the live view, replicas' counters and telemetry put together, start to end."""
