"""A person's work apps: mail, calendar, contacts and project tasks, generated from a seed (world.py, words.py).

The environment (environment.py) plays and judges episodes; the apps' operations are apps.py's and their tools'
documentation and argument checking tools.py's; its world for task making (envs/exploration.py) is explorer.py's
and session.py's (with explore_values.py, workflows.py and the requests of templates.py). envs/registry.py builds
it for ``environment.name: workplace``."""
