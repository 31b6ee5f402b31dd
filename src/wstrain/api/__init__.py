"""The API process: a stateless FastAPI app over the Redis job store. app.py assembles thin
routers per resource (routes/), their dependencies (deps.py), the one WstrainError -> HTTP
mapper (errors.py), the submission checks (validation.py) and the off-loop planner processes
every submission goes through (planning.py, plan_pool.py). Run it with `wstrain-api` or
`wstrain serve`. Never imports torch.
"""
