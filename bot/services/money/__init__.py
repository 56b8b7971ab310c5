"""Services of money: the ledger, costs, spend, budgets, bills, the digest, advice and price
tables."""
