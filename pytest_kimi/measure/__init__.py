"""Trials, steady-state windows and figures, and the session that runs them; no verdict against a baseline here."""
