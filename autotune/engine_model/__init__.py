"""The model of a serving engine, pure and in virtual time: the step-time roofline, the
continuous-batching scheduler with its KV cache and prefix cache, and the fit of the
step model to measured runs. servers/sim/ is its HTTP face; the sweep's prior and the
virtual probe step it directly."""
