"""Settings of ``rolloutbus dashboard``, from ``ROLLOUTBUS_DASHBOARD_*`` environment variables."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from foundation.config import PORT, CommonSettings, check_http_url


class DashboardSettings(CommonSettings):
    """Where the dashboard serves, who may read it, how often the page refreshes, and the SQL box's user."""

    dashboard_host: str = Field(default="127.0.0.1", description="Address the dashboard serves on.")
    dashboard_port: int = Field(default=8050, **PORT, description="Port of the dashboard.")
    dashboard_token: SecretStr | None = Field(default=None, description="Bearer token the page and API need; unset: no auth.")
    insecure: bool = Field(default=False, description="Listen on a non-loopback address without a token (logged loudly).")
    dashboard_refresh_s: float = Field(default=5.0, ge=1, le=3600, description="Seconds between the page's refreshes.")
    dashboard_analyst_user: str | None = Field(
        default=None, description="Store user the SQL box runs as (an analyst); unset: the DSN's user, with readonly=1.")
    dashboard_analyst_password: SecretStr | None = Field(default=None, description="Password of the SQL box's user.")
    dashboard_kafka_lag: bool = Field(default=True, description="Ask Kafka for consumer-group lag (false: ClickHouse only).")
    dashboard_scrape: str | None = Field(
        default=None, description="Comma-separated Prometheus /metrics URLs of gateways and producers to show (requests by "
                                  "status, spool depth); a target's token as the URL's password: http://metrics:<token>@host/metrics.")

    @field_validator("dashboard_scrape")
    @classmethod
    def _scrape_urls(cls, v: str | None) -> str | None:
        for url in (v or "").split(","):
            if url.strip():
                check_http_url(url.strip())
        return v

    def scrape_targets(self) -> list[str]:
        return [u.strip() for u in (self.dashboard_scrape or "").split(",") if u.strip()]
