"""What to send: the @throughput marker's arguments, prompt sets and request bodies."""
