"""The training-thread side: hooks that write bounded, lock-protected state (steps, modules)."""
