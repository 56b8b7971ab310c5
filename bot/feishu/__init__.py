"""The Feishu (Lark) front end: cards, the OpenAPI client, the notifier and its stand-in."""
