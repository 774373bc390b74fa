"""BFCL v3 multi-turn (bfcl-eval): the environment (environment.py) with its API access (api.py), official
entries (official.py), its world for task making (explorer.py, explore_values.py, templates.py),
and bfcl-eval's own prompts (prompts.py). envs/registry.py builds it for ``environment.name: bfcl``."""
