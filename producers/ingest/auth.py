"""The gateway's one credential check, for every route that needs its token. Pure.

``Authorization: Bearer <token>``, or ``Basic base64(<any user>:<token>)``: HTTP clients turn a URL's
userinfo into the Basic form (aiohttp, which Agent Lightning 0.3's ``LightningStoreClient`` uses, and
requests, which its OTLP exporter uses), so ``http://agl:<token>@gateway:4318`` carries the token in
the one URL a client is given. The user name is not checked; the comparison is constant-time.
"""

from __future__ import annotations

import base64
import binascii
import hmac

# The words every 401 of the gateway says (clients and tests match them); the challenge names both forms.
REFUSED = "missing or wrong bearer token"
CHALLENGE = {"WWW-Authenticate": 'Bearer, Basic realm="rolloutbus"'}


def authorized(header: str | bytes, token: str) -> bool:
    """True when the ``Authorization`` header carries ``token`` (Bearer, or as a Basic password)."""
    if isinstance(header, str):
        try:
            header = header.encode()
        except UnicodeEncodeError:  # bytes that were not UTF-8 (aiohttp keeps them as surrogates): not our token
            return False
    want = token.encode()
    scheme, _, rest = header.strip().partition(b" ")
    scheme = scheme.lower()
    if scheme == b"basic":
        try:
            decoded = base64.b64decode(rest.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        _user, colon, given = decoded.partition(b":")
        return bool(colon) and hmac.compare_digest(given, want)
    # Bearer, and anything else: compared whole, so a wrong scheme is as wrong as a wrong token.
    return hmac.compare_digest(header.strip(), b"Bearer " + want)


__all__ = ["authorized", "REFUSED", "CHALLENGE"]
