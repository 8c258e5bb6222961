"""Native CPU kernels (C through ctypes), built per machine; the pure-torch path is the fallback."""
