"""Model servers autotune can launch, health-check and stop: `launcher` (any process), `sim/`."""
