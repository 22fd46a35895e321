"""The RL view of rollouts: GRPO groups and their bookkeeping, batch steps with
over-sampling and carry-over, the trainer stand-in beside the rollouts, and the
`autotune loop` job."""
