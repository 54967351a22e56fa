"""Verification of real answers (DESIGN.md "Verifying real answers"): a sampled
share of renters' answers re-scored by prefill on a device of another owner (a
``verify`` offer answered by ``scores``).

``plausibility``: the judge (pure, no Django); ``rate``: how likely a device's
answer is verified; ``records``: the choice at a job's end, the verifier, the
scores judged and paid; ``verdicts``: what the rounds decide for the host;
``verifiers``: who verifies and its pay; ``checks``: checks of verifiers
(``check_calibration`` makes them); ``answers``: what a verification scores;
``offers``: the ``verify`` frame and its sending to the verifier's connection.
"""
