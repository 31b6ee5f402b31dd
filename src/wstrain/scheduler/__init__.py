"""What the API, the agent and the worker share (contracts), the autoconfigurator
(planning), the Redis job store and the per-host agent."""
