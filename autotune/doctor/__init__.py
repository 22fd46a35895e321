"""`autotune doctor`'s model of a real RL run: its telemetry read (formats, names), where
its step time goes (anatomy) and what each remedy would make of it (remedies)."""
