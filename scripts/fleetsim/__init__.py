"""Fleet-scale routing simulation: the real router (dispatcher, policy, prefix index) driving
simulated workers with a hash-level LRU prefix cache and a prefill/decode cost model."""
