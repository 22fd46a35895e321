"""The rollout runtime: what one rollout needs (workload, target, model calls through
`backends/`, tools, the verifier's hand-off, replicas, the rollout files) and the engine
that runs many at once."""
