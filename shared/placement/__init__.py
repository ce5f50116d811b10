"""Models placed on host agents by demand: the messages and the memory estimate that the router (router/placement/) and the host agents (fleet/host/) share."""
