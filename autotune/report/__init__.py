"""Outputs built from saved results only: terminal text, self-contained HTML and plots.

Nothing here measures or reads a live study: every function takes a result type of
`autotune.results` (as loaded from diagnose.json or sweep.json).
"""
