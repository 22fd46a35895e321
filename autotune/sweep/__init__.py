"""`autotune sweep`: an Optuna study over server knobs, each trial one configuration
measured (by default its throughput-versus-parallelism curve), the best recommended and
validated under load. The modules, and why: docs/design/sweep.md.
"""
