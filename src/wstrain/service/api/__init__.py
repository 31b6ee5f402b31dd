"""The API's HTTP layer: thin routers per resource (routes/), their FastAPI dependencies
(deps.py), the one WstrainError -> HTTP mapper (errors.py) and the off-loop planner every
submission goes through (planning.py). service/app.py assembles them; run the API with
`wstrain-api` or `wstrain serve`.
"""
