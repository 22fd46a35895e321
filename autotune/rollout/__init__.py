"""The rollout runtime: what one rollout needs (workload, target, model calls, tools,
verifiers' hand-off, replicas, the rollout files) and the engine that runs many at once;
`collect_job` is the `autotune collect` job built on it."""
