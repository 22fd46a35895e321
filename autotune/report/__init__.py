"""Outputs built from saved results: terminal text now, HTML reports."""
