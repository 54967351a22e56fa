"""Verification of real answers (DESIGN.md "Verifying real answers"; issue 22
item 4): a sampled share of renters' answers re-scored by prefill on a device
of another owner.

``plausibility``: the judge (pure); ``rate``: how likely a device's answer is
verified; ``records``: the choice at a job's end, the verifier, the scores
judged, paid and their consequences; ``offers``: the ``verify`` frame and its
sending to the verifier's connection.
"""
