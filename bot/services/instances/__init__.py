"""Services of an instance's life: registration, lookup, polling, deadlines, releases, rentals,
reconcile."""
