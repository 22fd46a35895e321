"""`python -m autotune.servers.sim [vLLM-style flags]`: run the simulated server."""

from autotune.servers.sim.server import main

raise SystemExit(main())
