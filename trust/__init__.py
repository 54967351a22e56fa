"""Trust: what keeps hosts honest (DESIGN.md "Spot checks", "Verifying real
answers"; docs/trust.md).

Above ``jobs`` in the layers contract: trust reads jobs' rows (the models stay
in ``jobs.models``: ``SpotCheck``, ``CanaryPrompt``, ``Verification``) and runs
its checks as jobs; jobs tells it that an attempt or a job ended, and asks it
whether a device can be spot-checked, through the one hook jobs owns
(``jobs.hooks``; the receiver: ``hooks.Trust``).

- ``spotchecks``: choosing, sending and judging spot checks; ``failures``:
  what follows a failed check of a device.
- ``canarygen``, ``canaryvocab``, ``canaries``: drawing check prompts and
  judging their answers; ``canarypool``: each model's pool, calibrated on a
  reference engine; ``canaryfleet``: answers established by the fleet;
  ``checkpools``: which models can be checked.
- ``verification``: verifying real answers and the checks of verifiers.
- ``consumers.MachineConsumer``: a machine's socket with its checks.
- ``tasks``: the Celery tasks (scheduled in ``ballast.celery``).
"""
