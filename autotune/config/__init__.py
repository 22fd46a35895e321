"""The one configuration model: every default, range and error sentence of a flag, a study
file and a bench suite, once. Why: docs/design/config.md."""
