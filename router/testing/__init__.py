"""Test helpers shipped with the router: a stand-in worker and a tiny tokenizer directory."""
