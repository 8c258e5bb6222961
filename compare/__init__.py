"""The compare harness: runs engine v0 and v1 side by side over HTTP and reports the ratios."""
