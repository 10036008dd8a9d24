"""Sessions: a conversation's tokens and KV blocks, its drift record, and the per-tenant session table."""
