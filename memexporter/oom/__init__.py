"""The OOM view and its forecast: used against the limit, the leak rate and the time until OOM (pure math)."""
