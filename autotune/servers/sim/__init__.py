"""The simulated vLLM-like server: the engine model (engine_model/) in scaled real time
behind an OpenAI-compatible HTTP front end over one or more engines, all marked
SIMULATED; `python -m autotune.servers.sim` serves it."""
