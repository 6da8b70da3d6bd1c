"""Maintainers' scripts run from the checkout (not installed with the package)."""
