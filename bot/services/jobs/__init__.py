"""Services of jobs: running them on an instance, who may, and what they look like."""
