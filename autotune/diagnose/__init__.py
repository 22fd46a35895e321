"""`autotune diagnose`: the paired low/high probes (`diagnose_job`), the checks table
each verdict cites and the rules that turn two probes into a verdict."""
