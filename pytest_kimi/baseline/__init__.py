"""The reviewed YAML baseline store: data model, provenance, file I/O and the update flow."""
