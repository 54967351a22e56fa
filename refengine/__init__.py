"""The coordinator's reference engine: the one place coordinator-side code runs a
model, SmolLM2-135M-Instruct through the agent's own llama.cpp engine, to
calibrate the spot-check pool and the checks of verifiers (DESIGN.md "Spot
checks").

The coordinator's packages (``ballast``, ``billing``, ``hosts``, ``jobs``,
``catalog``, ``accounts``, ``support``) import nothing of ``agent`` nor
``llama_cpp`` (import-linter contract ``coordinator-no-engine``); this app may.
Installed, it registers its engines with ``trust.canarypool``
(``ReferenceEngines``) when Django starts; left out of ``INSTALLED_APPS`` (a
coordinator without llama-cpp-python), no pool is calibrated by the coordinator.
Issue 31 item 4 replaces it: the right answers established by the fleet.

- ``refengine.engines``: the engine of a model, an ``Answerer``, the judge and
  sampler of checks of verifiers.
- ``manage.py canary_calibrate MODEL``: fill a model's pool now.
"""
