"""Helpers the tests share (one home each): busy-machine reruns of inner sessions, headless
Chromium, a throwaway PostgreSQL server, polling and timing bounds, the optional Otava extra."""
