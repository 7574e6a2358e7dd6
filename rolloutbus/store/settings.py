"""Settings of the store process (``rolloutbus store``), from ``ROLLOUTBUS_*`` environment variables."""

from __future__ import annotations

from pydantic import Field

from foundation.config import CommonSettings
from rolloutbus.store.access import Limits, User, parse_users


class StoreSettings(CommonSettings):
    """``ROLLOUTBUS_STORE_*``: where the store serves, who may use it, what an analyst query may take."""

    store_users: str = Field(
        default="",
        description="Users: a file of 'name role password' lines, or 'name:role:password,...' (roles: writer, analyst). "
        "Unset: one writer, 'default', no password.",
    )
    insecure: bool = Field(default=False, description="Listen on a non-loopback address with a user that has no password "
                           "(logged loudly).")
    store_analyst_max_execution_time_s: float = Field(default=60.0, ge=0, description="Longest analyst query, seconds (0: no limit).")
    store_analyst_max_result_rows: int = Field(default=1_000_000, ge=0, description="Most rows an analyst query returns (0: no limit).")
    store_analyst_max_result_bytes: int = Field(default=1 << 30, ge=0, description="Most bytes an analyst result holds (0: no limit).")

    def users(self) -> tuple[User, ...]:
        return parse_users(self.store_users)

    def has_credentials(self) -> bool:
        """Every user needs a password: one user without is an open door."""
        return all(u.password.get_secret_value() for u in self.users())

    def limits(self) -> Limits:
        return Limits(self.store_analyst_max_execution_time_s, self.store_analyst_max_result_rows, self.store_analyst_max_result_bytes)
