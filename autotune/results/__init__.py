"""Result types: frozen, versioned, saved as JSON by one writer and read back by one reader.
Why: docs/design/results.md."""
