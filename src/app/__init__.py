"""The imperative shell: configuration, the composition root, the client, the self-test."""
