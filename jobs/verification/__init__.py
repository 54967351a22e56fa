"""Verification of real answers (DESIGN.md "Verifying real answers").

A sampled share of real answers is scored by prefill on another device of the
same model (a ``verify`` offer answered by ``scores``); ``plausibility`` judges
what came back. Pure modules here import nothing of Django.
"""
