"""The regression gate: statistics, the adaptive trial policy, verdicts, and the gated measurement of one test."""
