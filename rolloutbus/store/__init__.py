"""The local ClickHouse store: one process owns the embedded engine and serves ClickHouse's HTTP
interface, so every other process (and any ClickHouse tool) connects to it as to a server."""

from rolloutbus.store.access import Limits, User, parse_users
from rolloutbus.store.local import LocalStore, lock_store

__all__ = ["Limits", "LocalStore", "User", "lock_store", "parse_users"]
