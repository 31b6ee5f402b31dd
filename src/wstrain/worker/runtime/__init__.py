"""The Runtime protocol and its two implementations: resident, and the working set."""
