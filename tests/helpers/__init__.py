"""What several test modules share: definitions, in-process and process helpers, the golden
harness."""
