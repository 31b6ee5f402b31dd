"""wstrain: a training service for a shared lab GPU queue.

Three processes and a client over shared layers (import-linter keeps the order, top down):
    cli                       the `wstrain` command and `wstrain serve`
    api | agent | worker      the HTTP API, the per-host agent, the training worker
    store | planning | prepare   Redis job store, autoconfigurator, token-file preparation
    settings                  what every Redis-speaking process shares (WSTRAIN_*)
    policy                    the scheduling policy as pure code
    contracts                 job specs, plans, states, errors: pydantic only
"""
