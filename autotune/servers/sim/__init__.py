"""The simulated server: the engine model (engine_model/) in scaled real time behind an
OpenAI-compatible HTTP front end over one or more engines, in vLLM's, SGLang's or
TensorRT-LLM's dialect, all marked SIMULATED; `python -m autotune.servers.sim` serves it."""
