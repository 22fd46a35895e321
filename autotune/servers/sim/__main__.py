"""`python -m autotune.servers.sim [flags]`: run the simulated server (vLLM's flag names, or
with `--engine` SGLang's or TensorRT-LLM's)."""

from autotune.servers.sim.server import main

raise SystemExit(main())
