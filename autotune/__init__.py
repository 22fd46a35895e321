"""autotune: measure and tune RL rollout collection throughput."""

__version__ = "0.1.0"
