"""Benchmarks and the team-month simulation (bench/team_month.py, its parts in bench/sim/)."""
