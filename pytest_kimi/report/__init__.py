"""Reports: each reads the JSON-shaped test results (``ThroughputResult.to_dict()``); none measures."""
