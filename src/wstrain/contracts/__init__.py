"""Job specs, plans, states, errors, model dimensions, node profiles and calibration
numbers: pydantic and the standard library only."""
