"""edgepipe's tests: unit/ (fast, single process), integration/ (processes, hosts,
wall-clock verdicts), helpers/ (shared fixtures and oracles)."""
