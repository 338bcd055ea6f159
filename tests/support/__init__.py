"""What several test files share: frames, free ports, job entries, the tier rules (one module each)."""
