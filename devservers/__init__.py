"""Real servers the tests and the benchmarks start on 127.0.0.1 for themselves (not shipped in the wheel): today a
throwaway PostgreSQL (:mod:`devservers.postgres`); and a lost machine's processes killed (:mod:`devservers.processes`).
The simulated LLM provider server is its own package, ``simserver``, because ``runner sim`` ships it."""
