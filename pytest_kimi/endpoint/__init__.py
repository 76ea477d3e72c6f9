"""The endpoint under test: URL checks, discovery, and server info made safe (scrubbed, parsed) where it enters."""
