"""The autoconfigurator: (spec, model, node profile) -> the fastest plan under the budgets,
with the cost model and the saved-activation DP."""
