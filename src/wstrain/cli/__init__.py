"""The user's client: the `wstrain` command (submit, follow, queue, plan, report, grants) over
the API's HTTP, and `wstrain serve`, which starts Redis, the API and an agent on one host.
Never imports torch."""
