"""`autotune sweep`: an Optuna study over server knobs, each trial one configuration's
throughput-versus-parallelism curve.

    curve.py      the curve algorithm: double parallelism on one running configuration
    search.py     Optuna: storage, sampler, the ask/tell loop, trials as saved records
    launchers.py  what starts one configuration and hands back a probe of it
    recommend.py  the recommendation, computed from a saved SweepResult
    job.py        the job: run or resume a study, save sweep.json, rebuild every output
"""
