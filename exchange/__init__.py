"""The exchange process: forwards publishers' batches to subscribers, by topic."""
